"""Fused Adam/AdamW by default on CUDA: one kernel launch per parameter group and step instead of torch's
``foreach`` default (several launches per group and per update term).

`prefer_fused` switches an already built ``torch.optim.Adam``/``AdamW`` to its fused implementation when the
choice is still open -- the caller passed neither ``fused`` nor ``foreach`` -- and every parameter can take it. It
works on optimizers built elsewhere (Megatron builds its own ``torch.optim.AdamW`` when TransformerEngine and Apex
are absent), which is why it acts on the built optimizer rather than on constructor arguments. The state layout
is the same as the ``foreach`` one, so checkpoints load either way.
"""

from __future__ import annotations

from typing import Sequence

import torch

#: devices whose parameters get the fused kernels by default (torch also has them on CPU; there the gain is small
#: and ``foreach`` stays torch's own default)
FUSED_DEFAULT_DEVICES: tuple[str, ...] = ('cuda',)


def prefer_fused(optimizer: torch.optim.Optimizer, devices: Sequence[str] = FUSED_DEFAULT_DEVICES) -> bool:
    """Turn on ``fused`` for a torch Adam/AdamW whose groups left both ``fused`` and ``foreach`` unset, before
    its first step, when every parameter is a floating tensor on one of `devices`. Returns whether it did."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW) or optimizer.state:
        return False
    groups = optimizer.param_groups
    if any(g.get('fused') is not None or g.get('foreach') is not None or g.get('differentiable') for g in groups):
        return False
    params = [p for g in groups for p in g['params']]
    if not params or any(p.device.type not in devices or not torch.is_floating_point(p) for p in params):
        return False
    for group in groups:
        group['fused'] = True
    optimizer.defaults['fused'] = True
    optimizer._step_supports_amp_scaling = True  # type: ignore[attr-defined]  # as the constructor sets for fused
    return True
