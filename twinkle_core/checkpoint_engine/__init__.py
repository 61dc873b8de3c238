"""Serves the Twinkle documents' ``twinkle.checkpoint_engine`` (weight sync; code: `twinkle_core.weight_sync`)."""

from twinkle_core.weight_sync import CheckpointEngine, WeightUpdate
from twinkle_core.weight_sync import __getattr__ as __getattr__

__all__ = ['CheckpointEngine', 'CheckpointEngineManager', 'SyncReport', 'WeightUpdate']
