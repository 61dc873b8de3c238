"""Tinker optimizer selection: `optimizer_config` (create_model, load_weights) and `optim_step` parameters.

`AdamOptimizerConfig` / `AdamParams` select AdamW; `DimuonOptimizerConfig` / `DimuonParams` select `Dimuon`
(twinkle_core/optimizer/dimuon.py). The family is fixed when the model is created (or restored with its
optimizer state) and kept in the adapter's `LoraSpec.optimizer`; an `optim_step` of the other family is a 422.
"""

from __future__ import annotations

from typing import Any

from tinker import types

from twinkle_server.api.deps import parse
from twinkle_server.engine.model_host.base import AdamStep, DimuonStep, OptimStep
from twinkle_server.errors import ApiError


def optimizer_family(config: Any) -> str:
    """The optimizer family a Tinker `OptimizerConfig` selects ('adamw' or 'dimuon'; 4xx for anything else)."""
    kind = getattr(config, 'type', 'adamw') if config is not None else 'adamw'
    if kind == 'dimuon':
        parse(types.DimuonOptimizerConfig, config.model_dump())  # its version (1) and no unknown fields: else 400
        return 'dimuon'
    if kind != 'adamw':
        raise ApiError(422, f'optimizer {kind!r} is not supported; use adamw (the default) or dimuon')
    return 'adamw'


def optim_step(params: Any) -> OptimStep:
    """The host-side step of an `OptimStepRequest.optim_params`, range-checked (400 naming the bad field)."""
    step: OptimStep
    if isinstance(params, types.AdamParams):
        step = AdamStep(
            params.learning_rate, params.beta1, params.beta2, params.eps, params.weight_decay, params.grad_clip_norm
        )
    elif getattr(params, 'type', None) == 'dimuon':
        dimuon = parse(types.DimuonParams, params.model_dump())  # the SDK's own checks: fields, ranges, finite
        step = DimuonStep(dimuon.learning_rate, dimuon.beta1, dimuon.grad_clip_norm)
    else:
        raise ApiError(
            422,
            f'optimizer params of type {getattr(params, "type", "?")!r} are not supported; send AdamParams '
            f'(adamw) or DimuonParams (dimuon), matching the optimizer the model was created with',
        )
    step.validate()
    return step
