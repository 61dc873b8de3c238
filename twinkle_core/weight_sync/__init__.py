"""Weight sync from a training model to a sampler (docs/architecture.md §5): kind `checkpoint_engine` (a
transport, `CheckpointEngine`), the (lazily imported, torch-using) `CheckpointEngineManager` that decides what to
move, the wire names and buckets (`weights`), plus lazy access to every registered checkpoint_engine by name.

Nothing here is a checkpoint: the kind keeps the name ``checkpoint_engine`` (its entry-point group, and the
Twinkle documents' ``twinkle_core.checkpoint_engine``, an alias of this package)."""

from typing import Any

from twinkle_core._lazy import kind_getattr
from twinkle_core.weight_sync.base import CheckpointEngine, WeightUpdate

__all__ = ['CheckpointEngine', 'CheckpointEngineManager', 'SyncReport', 'WeightUpdate']

_registered = kind_getattr('checkpoint_engine', __name__)


def __getattr__(name: str) -> Any:
    if name in ('CheckpointEngineManager', 'SyncReport'):
        from twinkle_core.weight_sync import manager

        return getattr(manager, name)
    return _registered(name)
