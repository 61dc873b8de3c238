"""The Tinker loss functions over per-token log-probs (sum reductions; TINKER_API.md "Losses").

`lp` is the learner's log-prob of each target token [B, T], `mask` marks positions with a target; `inputs` holds
the per-token fields shifted the same way: `weights` (cross_entropy), `old_logps` (the sampler's log-probs q)
and `advantages` (A). Every function returns a scalar tensor to backpropagate.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

Fn = Callable[[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, Any]], torch.Tensor]


def cross_entropy(lp, mask, inputs, config):
    return -(inputs['weights'] * lp * mask).sum()


def importance_sampling(lp, mask, inputs, config):
    ratio = torch.exp(lp - inputs['old_logps'])
    return -(ratio * inputs['advantages'] * mask).sum()


def ppo(lp, mask, inputs, config):
    lo, hi = float(config.get('clip_low_threshold', 0.8)), float(config.get('clip_high_threshold', 1.2))
    ratio = torch.exp(lp - inputs['old_logps'])
    adv = inputs['advantages']
    return -(torch.minimum(ratio * adv, ratio.clamp(lo, hi) * adv) * mask).sum()


def cispo(lp, mask, inputs, config):
    lo, hi = float(config.get('clip_low_threshold', 0.0)), float(config.get('clip_high_threshold', 4.0))
    ratio = torch.exp(lp - inputs['old_logps']).clamp(lo, hi).detach()
    return -(ratio * lp * inputs['advantages'] * mask).sum()


def dro(lp, mask, inputs, config):
    beta = float(config.get('beta', 0.0))
    q = inputs['old_logps']
    return -((lp * inputs['advantages'] - 0.5 * beta * (lp - q) ** 2) * mask).sum()


LOSSES: dict[str, Fn] = {f.__name__: f for f in (cross_entropy, importance_sampling, ppo, cispo, dro)}
