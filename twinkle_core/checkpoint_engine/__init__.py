"""Kind `checkpoint_engine`: the interface, plus lazy access to every registered checkpoint_engine by name."""
from twinkle_core._lazy import kind_getattr
from twinkle_core.checkpoint_engine.base import CheckpointEngine

__getattr__ = kind_getattr('checkpoint_engine', __name__)
