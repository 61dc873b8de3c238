"""Engines: the training/sampling stack behind the service (see `base.Engine`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinkle_server.engine.base import AdamStep, Engine, LoraSpec, SampleJob, TrainBatch, TrainResult

__all__ = [
    'AdamStep',
    'Engine',
    'LoraSpec',
    'SampleJob',
    'TrainBatch',
    'TrainResult',
    'load_engine',
    'resolve_model_dir',
]


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


def load_engine(
    base_model: str,
    path: str,
    *,
    device: str | None = None,
    backend: str = 'MultiLoraTransformersModel',
    backend_args: dict[str, Any] | None = None,
    pass_strategy: str | None = None,
    sampler: str = 'TorchSampler',
    sampler_args: dict[str, Any] | None = None,
) -> Engine:
    """The engine hosting `path` under the public name `base_model`: the model registered as `backend` (kind
    `model`, built with `backend_args`) for training and the sampler registered as `sampler` (kind `sampler`,
    built with `sampler_args`) for generation. `pass_strategy` (multi-LoRA backends: 'auto', 'mixed' or
    'one_by_one') is a shortcut for ``backend_args['pass_strategy']``."""
    from twinkle_server.engine.twinkle_engine import TwinkleEngine

    backend_args = dict(backend_args or {})
    if pass_strategy is not None:
        backend_args['pass_strategy'] = pass_strategy
    return TwinkleEngine(
        base_model,
        resolve_model_dir(path),
        device=device,
        backend=backend,
        backend_args=backend_args,
        sampler=sampler,
        sampler_args=sampler_args,
    )
