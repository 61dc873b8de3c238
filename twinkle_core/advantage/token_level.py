"""Per-token advantages: GAE with a critic's values (PPO) and REINFORCE++ (no critic, batch-normalised returns).

Both take one scalar reward per completion, credited at its last token, and optionally a per-token KL penalty in
the reward (``kl``: per completion, one estimate of KL(policy || reference) per completion token, e.g. ``logp -
ref_logp`` (k1); ``kl_coef``: its weight), so the per-token reward is::

    r_t = -kl_coef * kl_t  (+ reward at the last token t = n - 1)

They return one list of per-token advantages per completion (`TokenAdvantages`, aligned with the completion's
tokens; a training row's per-token field ``advantages`` holds them at the completion's label positions and 0 on
the prompt) and, on ``.returns``, the per-token returns (the critic's regression targets for GAE).
"""

from __future__ import annotations

import math
from statistics import fmean, pstdev
from typing import Sequence

from twinkle_core.advantage.base import Advantage
from twinkle_core.advantage.group_relative import split_groups
from twinkle_core.errors import InvalidInputError


class TokenAdvantages(list[list[float]]):
    """Per completion, per token advantages; ``returns``: the per-token returns, in the same layout."""

    returns: list[list[float]]

    def tolist(self) -> list[list[float]]:
        return [list(a) for a in self]


def token_rewards(
    who: str, rewards: Sequence[float], lengths: Sequence[int], kl: Sequence[Sequence[float]] | None, kl_coef: float
) -> list[list[float]]:
    """The per-token rewards ``r_t`` of the module docstring, validated."""
    if len(rewards) != len(lengths):
        raise InvalidInputError(f'{who}: {len(rewards)} rewards for {len(lengths)} completions; give one each.')
    if kl is not None and len(kl) != len(rewards):
        raise InvalidInputError(f'{who}: kl has {len(kl)} completions but rewards has {len(rewards)}.')
    out = []
    for i, (reward, n) in enumerate(zip(rewards, lengths)):
        if not math.isfinite(float(reward)):
            raise InvalidInputError(f'{who}: reward {i} is {reward}; rewards must be finite.')
        if n < 1:
            raise InvalidInputError(f'{who}: completion {i} has no tokens.')
        per_token = [0.0] * n
        if kl is not None:
            if len(kl[i]) != n:
                raise InvalidInputError(
                    f'{who}: completion {i} has {n} tokens but {len(kl[i])} kl values; give one per completion token.'
                )
            per_token = [-kl_coef * float(k) for k in kl[i]]
        per_token[-1] += float(reward)
        out.append(per_token)
    return out


def normalise(values: list[list[float]], shift_mean: bool = True) -> list[list[float]]:
    """(x - mean) / std over every token of the batch (population std; 1 where all are equal); without
    `shift_mean` only divided by the std."""
    flat = [x for row in values for x in row]
    mean, std = fmean(flat), pstdev(flat)
    scale = std if std > 0 else 1.0
    return [[((x - mean) if shift_mean else x) / scale for x in row] for row in values]


class GAEAdvantage(Advantage):
    """Generalised advantage estimation (Schulman et al., 2016) from a critic's per-token values::

        delta_t = r_t + gamma * V_{t+1} - V_t      (V_n = 0: the completion ends the episode)
        A_t     = delta_t + gamma * lam * A_{t+1}
        return_t = A_t + V_t

    ``whiten``: advantages normalised over every token of the call (mean 0, std 1; ``shift_mean=False`` keeps their
    mean), as TRL's and OpenRLHF's PPO do; returns are never whitened."""

    def __init__(self, gamma: float = 1.0, lam: float = 0.95, *, whiten: bool = True, shift_mean: bool = True) -> None:
        for name, value in (('gamma', gamma), ('lam', lam)):
            if not 0.0 <= value <= 1.0:
                raise InvalidInputError(f'GAEAdvantage: {name} must be in [0, 1], got {value}.')
        self.gamma, self.lam, self.whiten, self.shift_mean = float(gamma), float(lam), whiten, shift_mean

    def __call__(
        self,
        rewards: Sequence[float],
        *,
        values: Sequence[Sequence[float]] | None = None,
        kl: Sequence[Sequence[float]] | None = None,
        kl_coef: float = 0.0,
        group_size: int | None = None,
        num_generations: int | None = None,
    ) -> TokenAdvantages:
        """`values`: per completion, the critic's value at each completion token (required). Groups play no part
        (`group_size` is accepted and ignored)."""
        if values is None:
            raise InvalidInputError(
                "GAEAdvantage needs values=: the critic's value at every completion token, one list per completion."
            )
        per_token = token_rewards('GAEAdvantage', rewards, [len(v) for v in values], kl, kl_coef)
        advantages, returns = [], []
        for r, v in zip(per_token, values):
            a, running = [0.0] * len(r), 0.0
            for t in reversed(range(len(r))):
                next_value = float(v[t + 1]) if t + 1 < len(r) else 0.0
                running = r[t] + self.gamma * next_value - float(v[t]) + self.gamma * self.lam * running
                a[t] = running
            advantages.append(a)
            returns.append([x + float(y) for x, y in zip(a, v)])
        out = TokenAdvantages(normalise(advantages, self.shift_mean) if self.whiten else advantages)
        out.returns = returns
        return out


class ReinforcePlusPlusAdvantage(Advantage):
    """REINFORCE++ (Hu, 2025; OpenRLHF's ``reinforce`` / ``reinforce_baseline`` estimators): the discounted return
    of the per-token rewards ``G_t = sum_{s >= t} gamma^(s-t) r_s``, then normalised over every token of the call
    (mean 0, std 1) -- a global baseline in place of a critic or a group's mean. ``baseline='group'``
    (REINFORCE++-baseline) first subtracts each prompt group's mean reward (needs ``group_size``)."""

    def __init__(self, gamma: float = 1.0, *, baseline: str = 'none') -> None:
        if not 0.0 <= gamma <= 1.0:
            raise InvalidInputError(f'ReinforcePlusPlusAdvantage: gamma must be in [0, 1], got {gamma}.')
        if baseline not in ('none', 'group'):
            raise InvalidInputError(
                f"ReinforcePlusPlusAdvantage: baseline must be 'none' or 'group', got {baseline!r}."
            )
        self.gamma, self.baseline = float(gamma), baseline

    def __call__(
        self,
        rewards: Sequence[float],
        *,
        lengths: Sequence[int] | None = None,
        kl: Sequence[Sequence[float]] | None = None,
        kl_coef: float = 0.0,
        group_size: int | None = None,
        num_generations: int | None = None,
    ) -> TokenAdvantages:
        """`lengths`: each completion's number of tokens (or given by `kl`'s lists); 1 each when neither is given
        (one advantage per completion)."""
        who = 'ReinforcePlusPlusAdvantage'
        rewards = [float(r) for r in rewards]
        if self.baseline == 'group':
            size = group_size if group_size is not None else num_generations
            if size is None:
                raise InvalidInputError(f"{who}(baseline='group') needs group_size= (completions per prompt).")
            rewards = [r - fmean(g) for g in split_groups(rewards, size, who) for r in g]
        if lengths is None:
            lengths = [len(k) for k in kl] if kl is not None else [1] * len(rewards)
        per_token = token_rewards(who, rewards, lengths, kl, kl_coef)
        returns = []
        for r in per_token:
            g, running = [0.0] * len(r), 0.0
            for t in reversed(range(len(r))):
                running = r[t] + self.gamma * running
                g[t] = running
            returns.append(g)
        out = TokenAdvantages(normalise(returns))
        out.returns = returns
        return out
