"""Group-relative advantages: GRPO and RLOO (pure Python; no torch needed).

`rewards` are ordered group by group: completions ``[k*G, (k+1)*G)`` answer prompt ``k`` (``G = group_size``).
The result has one advantage per completion, in the same order; broadcast it over a completion's tokens (the
per-row field ``advantage``) or repeat it per token (``advantages``).
"""

from __future__ import annotations

import math
from statistics import fmean, stdev
from typing import Any, Literal, Sequence

from twinkle_core.advantage.base import Advantage, Advantages, group_size_of
from twinkle_core.errors import InvalidInputError

GRPOScale = Literal['group', 'batch', 'none']


def split_groups(rewards: Sequence[float], group_size: int, who: str) -> list[list[float]]:
    """Validate `rewards` and cut them into consecutive groups of `group_size` (each needs >= 2 completions)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise InvalidInputError(
            f'{who}: group_size must be an int >= 2 (several completions per prompt), got {group_size!r}.'
        )
    values = [float(r) for r in rewards]
    if not values or len(values) % group_size:
        raise InvalidInputError(
            f'{who}: got {len(values)} rewards, which is not a positive multiple of group_size={group_size}; '
            f'order rewards group by group with exactly group_size completions per prompt.'
        )
    for i, value in enumerate(values):
        if not math.isfinite(value):
            raise InvalidInputError(f'{who}: reward {i} (group {i // group_size}) is {value}; rewards must be finite.')
    return [values[i : i + group_size] for i in range(0, len(values), group_size)]


class GRPOAdvantage(Advantage):
    """``A_i = (r_i - mean(group)) / (std + epsilon)``.

    ``scale``: ``'group'`` divides by the group's standard deviation (GRPO), ``'batch'`` by the standard deviation
    of all rewards in the call, ``'none'`` does not divide (Dr. GRPO). Standard deviations are sample ones
    (``n - 1`` denominator, as in TRL). A group whose rewards are all equal gets advantage 0. ``positive_only``:
    advantages below 0 become 0, so a step trains only towards the completions that beat their group's mean and
    never away from the others (steadier on small models, where pushing down sampled text can collapse a policy).
    """

    def __init__(self, scale: GRPOScale = 'group', epsilon: float = 1e-6, *, positive_only: bool = False) -> None:
        self.scale, self.epsilon = _check_scale(scale), float(epsilon)
        self.positive_only = bool(positive_only)
        if epsilon < 0:
            raise InvalidInputError(f'GRPOAdvantage: epsilon must be >= 0, got {epsilon}.')

    def __call__(
        self,
        rewards: Sequence[float],
        *,
        group_size: int | None = None,
        num_generations: int | None = None,
        scale: GRPOScale | None = None,
    ) -> Advantages:
        """`scale` overrides the constructor's for this call (the Twinkle documents pass it here)."""
        scale = _check_scale(scale) if scale is not None else self.scale
        groups = split_groups(rewards, group_size_of(group_size, num_generations, 'GRPOAdvantage'), 'GRPOAdvantage')
        batch_std = stdev([r for g in groups for r in g]) if scale == 'batch' else 0.0
        out = Advantages()
        for group in groups:
            mean = fmean(group)
            if scale == 'none':
                denominator = 1.0
            else:
                # std == 0 means every reward in scope is equal, so the numerator is 0 too
                denominator = (stdev(group) if scale == 'group' else batch_std) + self.epsilon or 1.0
            values = [(r - mean) / denominator for r in group]
            out.extend([max(a, 0.0) for a in values] if self.positive_only else values)
        return out


def _check_scale(scale: Any) -> GRPOScale:
    if scale not in ('group', 'batch', 'none'):
        raise InvalidInputError(f"GRPOAdvantage: scale must be 'group', 'batch' or 'none', got {scale!r}.")
    return scale


class RLOOAdvantage(Advantage):
    """REINFORCE leave-one-out: ``A_i = r_i - mean(r_j for j != i in the group) = G/(G-1) * (r_i - mean(group))``."""

    def __call__(
        self, rewards: Sequence[float], *, group_size: int | None = None, num_generations: int | None = None
    ) -> Advantages:
        size = group_size_of(group_size, num_generations, 'RLOOAdvantage')
        out = Advantages()
        for group in split_groups(rewards, size, 'RLOOAdvantage'):
            total = sum(group)
            out.extend(r - (total - r) / (size - 1) for r in group)
        return out
