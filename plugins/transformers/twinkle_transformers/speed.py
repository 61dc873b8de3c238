"""Training-speed and memory options of `TransformersModel`: regional compilation of the decoder layers, activation
checkpointing, and mixed precision (bf16 autocast over float32 parameters: fp32 master weights, gradients and
optimizer state).

- ``compile_layers=True`` compiles each decoder layer in place (regional compilation,
  `twinkle_core.train.compile`). The first steps pay the compile time; padding-free batches of new lengths
  compile once more with dynamic shapes, then reuse the graph.
- ``gradient_checkpointing=True`` (or a policy: every k-th layer, selective, chosen layers) recomputes the chosen
  decoder layers' activations in backward (`twinkle_core.train.activation_checkpointing`); shared with
  `MultiLoraTransformersModel`.
- ``mixed_precision='bf16'`` keeps the parameters in float32 and runs forward passes under
  ``torch.autocast(dtype=bfloat16)``: matmuls and attention in bf16, reductions in fp32, updates on fp32 weights.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn

from twinkle_core.errors import InvalidInputError
from twinkle_core.train.activation_checkpointing import apply_activation_checkpointing, checkpoint_policy
from twinkle_core.train.compile import compile_backend, compile_blocks
from twinkle_transformers.forward import unwrap_causal_lm

#: accepted ``mixed_precision`` values -> the autocast dtype
MIXED_PRECISION: dict[str, torch.dtype] = {'bf16': torch.bfloat16, 'bfloat16': torch.bfloat16}


def decoder_layers(model: nn.Module, option: str = 'compile_layers') -> nn.ModuleList:
    """The decoder's layer list (``model.model.layers`` for Llama/Qwen-style causal LMs); `option` names the
    setting that needs it in the error for a model without one."""
    base = unwrap_causal_lm(model)
    get_decoder = getattr(base, 'get_decoder', None)
    layers = getattr(get_decoder() if callable(get_decoder) else None, 'layers', None)
    if not isinstance(layers, nn.ModuleList):
        raise InvalidInputError(
            f'{option}: {type(base).__name__} has no decoder layer list (get_decoder().layers); pass {option}=False.'
        )
    return layers


def compile_decoder_layers(model: nn.Module, compile_layers: bool | str) -> str | None:
    """Compile every decoder layer in place (`twinkle_core.train.compile`); returns the backend, None if off."""
    if compile_backend(compile_layers) is None:
        return None
    return compile_blocks(decoder_layers(model), compile_layers)


def checkpoint_decoder_layers(model: nn.Module, gradient_checkpointing: object) -> list[int]:
    """Checkpoint the decoder layers `gradient_checkpointing` chooses, in place; returns their indices."""
    if checkpoint_policy(gradient_checkpointing) is None:
        return []
    return apply_activation_checkpointing(list(decoder_layers(model, 'gradient_checkpointing')), gradient_checkpointing)


def autocast_dtype(mixed_precision: str | None, param_dtype: torch.dtype) -> torch.dtype | None:
    """The autocast dtype for `mixed_precision` (None: no autocast); checks the parameters are float32."""
    if mixed_precision is None:
        return None
    if mixed_precision not in MIXED_PRECISION:
        raise InvalidInputError(
            f'Unknown mixed_precision {mixed_precision!r}; use one of {sorted(MIXED_PRECISION)} or None.'
        )
    if param_dtype != torch.float32:
        raise InvalidInputError(
            f'mixed_precision={mixed_precision!r} keeps float32 master weights, but dtype is '
            f'{str(param_dtype).removeprefix("torch.")}; leave dtype unset (float32 then) or pass dtype="float32".'
        )
    return MIXED_PRECISION[mixed_precision]


def autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager[object]:
    """``torch.autocast`` to `dtype` on `device`'s type, or a no-op context for None."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
