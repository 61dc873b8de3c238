"""Kind `checkpoint_engine`: the interface, the (lazily imported, torch-using) `CheckpointEngineManager`, plus lazy
access to every registered checkpoint_engine by name."""

from typing import Any

from twinkle_core._lazy import kind_getattr
from twinkle_core.checkpoint_engine.base import CheckpointEngine, WeightUpdate

__all__ = ['CheckpointEngine', 'CheckpointEngineManager', 'SyncReport', 'WeightUpdate']

_registered = kind_getattr('checkpoint_engine', __name__)


def __getattr__(name: str) -> Any:
    if name in ('CheckpointEngineManager', 'SyncReport'):
        from twinkle_core.checkpoint_engine import manager

        return getattr(manager, name)
    return _registered(name)
