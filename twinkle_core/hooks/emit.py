"""What the rest of twinkle calls to fire lifecycle hooks. Each function is a no-op when nothing implements
the hook, and a failing logger/notifier never breaks the caller (`call_each` logs and skips it)."""

from __future__ import annotations

from typing import Any, Mapping

from twinkle_core.hooks.manager import call_each, get_plugin_manager


def emit_metrics(step: int, metrics: Mapping[str, Any], context: Mapping[str, Any] | None = None) -> None:
    """Send one step's metrics to every ``twinkle_metrics`` implementation (console, JSONL, TensorBoard, ...).

    `context` says whose metrics these are, e.g. ``{'adapter_name': 'tenant-a', 'is_training': True}``.
    """
    call_each('twinkle_metrics', step=int(step), metrics=dict(metrics), context=dict(context or {}))


def emit_failure(exc: BaseException, context: Mapping[str, Any] | None = None) -> None:
    """Tell notifiers that a step or request failed. Never raises."""
    call_each('twinkle_failure', exc=exc, context=dict(context or {}))


def notify_model_loaded(model: Any, model_id: str) -> None:
    """Run ``twinkle_model_loaded`` implementations (load-time patches). Unlike metrics, an exception here
    propagates: a patch that did not apply must not go unnoticed."""
    get_plugin_manager().hook.twinkle_model_loaded(model=model, model_id=model_id)
