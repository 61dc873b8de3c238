"""Tinker-compatible API (`/api/v1`): the wire contract of the official `tinker` SDK (see docs/tinker_api.md)."""
