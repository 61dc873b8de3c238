"""Small helpers preprocessors share to build `Trajectory` dicts with one Arrow-friendly schema."""

from __future__ import annotations

from typing import Any


def message(role: str, content: str) -> dict[str, Any]:
    """A message dict with the fixed keys every built-in preprocessor emits (role, content)."""
    return {'role': role, 'content': content}


def with_system(system: str | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return ([message('system', system)] if system else []) + messages
