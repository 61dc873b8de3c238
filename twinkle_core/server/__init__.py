"""Helpers for talking to a training service from twinkle data (the server itself is the twinkle-server
plugin)."""
