"""Hook specifications. Implement them with ``@twinkle_core.hooks.hook`` on a class or module."""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT = 'twinkle'
hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def twinkle_metrics(step: int, metrics: dict[str, Any], context: dict[str, Any]) -> None:
    """Metrics of one step (`context`: e.g. {'adapter_name': ..., 'is_training': True})."""


@hookspec
def twinkle_failure(exc: BaseException, context: dict[str, Any]) -> None:
    """A step or request failed (for notifiers). Must not raise."""


@hookspec
def twinkle_model_loaded(model: Any, model_id: str) -> None:
    """A backend finished loading `model` (patches that must apply at load time hook in here)."""


@hookspec
def twinkle_cli(subparsers: Any) -> None:
    """Add subcommands to the `twinkle` CLI (`subparsers` is an argparse sub-parsers action)."""
