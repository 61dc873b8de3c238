"""Engines: the training/sampling stack behind the service (see `base.Engine`)."""
from __future__ import annotations

import logging
from pathlib import Path

from twinkle_server.engine.base import AdamStep, Engine, LoraSpec, SampleJob, TrainBatch, TrainResult

logger = logging.getLogger(__name__)

__all__ = ['AdamStep', 'Engine', 'LoraSpec', 'SampleJob', 'TrainBatch', 'TrainResult', 'load_engine',
           'resolve_model_dir']


def resolve_model_dir(path: str) -> str:
    """A local directory for `path`: itself, or a `ms://`/`hf://` snapshot (operator-named, resolved at start)."""
    from twinkle_core.hub.ref import is_hub_ref
    if is_hub_ref(path):
        from twinkle_core.hub.download import snapshot
        from twinkle_core.hub.ref import HubRef
        return str(snapshot(HubRef.parse(path)))
    if not Path(path).is_dir():
        raise FileNotFoundError(f'model directory {path!r} does not exist (pass NAME=DIR or an ms:// / hf:// id)')
    return str(Path(path).resolve())


def load_engine(base_model: str, path: str, kind: str = 'auto') -> Engine:
    """`kind`: 'twinkle' (MultiLoraTransformersModel + TorchSampler), 'peft' (stop-gap), or 'auto' (the
    first that is installed, in that order)."""
    model_dir = resolve_model_dir(path)
    if kind in ('auto', 'twinkle'):
        try:
            from twinkle_server.engine.twinkle_engine import TwinkleEngine
        except ImportError as exc:
            if kind == 'twinkle':
                raise
            logger.warning('multi-LoRA engine unavailable (%s); using the peft stop-gap engine', exc)
        else:
            return TwinkleEngine(base_model, model_dir)
    if kind not in ('auto', 'peft'):
        raise ValueError(f'unknown engine {kind!r}; use auto, twinkle or peft')
    from twinkle_server.engine.peft_engine import PeftEngine
    return PeftEngine(base_model, model_dir)
