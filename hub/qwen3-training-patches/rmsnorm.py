"""Qwen3RMSNormFP32: run Qwen3's RMSNorm fully in fp32.

Transformers' Qwen3RMSNorm normalises in fp32 but casts back to the input dtype *before* multiplying by the
weight, so in bf16 every norm rounds twice. This patch keeps the weight multiply in fp32 and rounds once,
which matches the fp32 reference exactly after the final cast (and is what Gemma-style norms do).
Applied per instance (``module.forward``), so it is scoped to one model and reversible.
"""
from __future__ import annotations

import types
from typing import Any

import torch

from twinkle_core.patch import Patch

from ._common import modules_named

DEFAULT_CLASSES = ('Qwen3RMSNorm',)


def fp32_rmsnorm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    input_dtype = hidden_states.dtype
    x = hidden_states.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return (self.weight.to(torch.float32) * x).to(input_dtype)


class Qwen3RMSNormFP32Patch(Patch):
    """``apply(model, class_names=('Qwen3RMSNorm',))`` -> the list of patched norm modules."""

    def apply(self, target: Any, class_names: tuple[str, ...] = DEFAULT_CLASSES, **kwargs: Any) -> list[Any]:
        patched = []
        for module in modules_named(target, tuple(class_names)):
            module.forward = types.MethodType(fp32_rmsnorm_forward, module)
            patched.append(module)
        if not patched:
            raise ValueError(f'{type(self).__name__}: no {", ".join(class_names)} module in {type(target).__name__}.')
        return patched

    def revert(self, target: Any) -> None:
        for module in target.modules():
            if getattr(module.__dict__.get('forward'), '__func__', None) is fp32_rmsnorm_forward:
                del module.forward
