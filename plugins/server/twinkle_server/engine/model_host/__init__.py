"""Model hosts: the training/sampling stack behind the service, one per hosted base model (see `base.ModelHost`).

`load_model_host` builds the in-process one (`local.LocalModelHost`); `twinkle_server.engine.ray_deploy` builds the one
on Ray device groups. Backends and samplers are built as their declared capabilities say (`construction`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinkle_core.hub.download import snapshot
from twinkle_core.hub.ref import HubRef, is_hub_ref
from twinkle_server.engine.model_host.base import (
    AdamStep,
    DimuonStep,
    LoraSpec,
    ModelHost,
    OptimStep,
    SampleJob,
    TrainBatch,
    TrainResult,
)

__all__ = [
    'AdamStep',
    'DimuonStep',
    'LoraSpec',
    'OptimStep',
    'ModelHost',
    'SampleJob',
    'TrainBatch',
    'TrainResult',
    'load_model_host',
    'resolve_model_dir',
]


def resolve_model_dir(path: str) -> str:
    """A local directory for `path`: itself, or a `ms://`/`hf://` snapshot (operator-named, resolved at start)."""
    if is_hub_ref(path):
        return str(snapshot(HubRef.parse(path)))
    if not Path(path).is_dir():
        raise FileNotFoundError(f'model directory {path!r} does not exist (pass NAME=DIR or an ms:// / hf:// id)')
    return str(Path(path).resolve())


def load_model_host(
    base_model: str,
    path: str,
    *,
    device: str | None = None,
    backend: str = 'MultiLoraTransformersModel',
    backend_args: dict[str, Any] | None = None,
    sampler: str = 'TorchSampler',
    sampler_args: dict[str, Any] | None = None,
) -> ModelHost:
    """The in-process host of `path` under the public name `base_model`: the model registered as `backend` (kind
    `model`, built with `backend_args`, e.g. ``{'pass_strategy': 'mixed'}`` for a backend that declares pass
    strategies) for training and the sampler registered as `sampler` (kind `sampler`, built with `sampler_args`)
    for generation. Raises ValueError for `backend_args` the backend does not declare (`construction`)."""
    from twinkle_server.engine.model_host.local import LocalModelHost

    return LocalModelHost(
        base_model,
        resolve_model_dir(path),
        device=device,
        backend=backend,
        backend_args=dict(backend_args or {}),
        sampler=sampler,
        sampler_args=sampler_args,
    )
