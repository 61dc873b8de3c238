"""Gradient-norm clipping that is correct for sharded (DTensor: FSDP2 / TP) gradients as well as plain ones."""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float | None) -> float:
    """Total gradient norm before clipping (clips to `max_norm` unless None); correct for DTensor (FSDP2/TP) grads."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    by_mesh: dict[Any, list[torch.Tensor]] = {}  # plain tensors under None, DTensors grouped by their mesh
    for g in grads:
        by_mesh.setdefault(getattr(g, 'device_mesh', None), []).append(g)
    squared = 0.0
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group, 2.0)
        squared += float(norm.full_tensor() if hasattr(norm, 'full_tensor') else norm) ** 2
    total = squared**0.5
    if max_norm is not None and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for g in grads:
            g.mul_(coef)
    return total
