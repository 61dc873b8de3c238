"""`CompletionRewardMetric`: reward and completion-length statistics of sampled completions (torch-free)."""
from __future__ import annotations

import math
from statistics import fmean, pstdev
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.metric.base import Metric


class CompletionRewardMetric(Metric):
    """Accumulates ``outputs['rewards']`` (one float per completion) and optional ``outputs['completion_lengths']``
    (tokens per completion). With ``group_size`` (at init or per call) it also reports the fraction of groups whose
    rewards are all equal -- those give GRPO no learning signal.

    `calculate` returns ``reward/mean|std|min|max``, ``completion_length/mean|min|max`` and
    ``reward/zero_std_group_frac`` when known.
    """

    def __init__(self, group_size: int | None = None) -> None:
        self.group_size = group_size
        self.reset()

    def reset(self) -> None:
        self.rewards: list[float] = []
        self.lengths: list[int] = []
        self.groups = self.flat_groups = 0

    def accumulate(self, inputs: Any, outputs: dict[str, Any], **kwargs: Any) -> None:
        rewards = [float(r) for r in outputs.get('rewards', kwargs.get('rewards')) or []]
        if any(not math.isfinite(r) for r in rewards):
            raise InvalidInputError('CompletionRewardMetric: rewards must be finite.')
        lengths = outputs.get('completion_lengths', kwargs.get('completion_lengths'))
        if lengths is not None:
            if len(lengths) != len(rewards):
                raise InvalidInputError(f'CompletionRewardMetric: {len(lengths)} completion_lengths for '
                                        f'{len(rewards)} rewards; give one length per completion.')
            self.lengths.extend(int(n) for n in lengths)
        group_size = kwargs.get('group_size', self.group_size)
        if group_size:
            if len(rewards) % group_size:
                raise InvalidInputError(f'CompletionRewardMetric: {len(rewards)} rewards are not a multiple of '
                                        f'group_size={group_size}.')
            for start in range(0, len(rewards), group_size):
                self.groups += 1
                self.flat_groups += len(set(rewards[start:start + group_size])) == 1
        self.rewards.extend(rewards)

    def calculate(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.rewards:
            out.update({'reward/mean': fmean(self.rewards), 'reward/std': pstdev(self.rewards),
                        'reward/min': min(self.rewards), 'reward/max': max(self.rewards)})
        if self.lengths:
            out.update({'completion_length/mean': fmean(self.lengths),
                        'completion_length/min': float(min(self.lengths)),
                        'completion_length/max': float(max(self.lengths))})
        if self.groups:
            out['reward/zero_std_group_frac'] = self.flat_groups / self.groups
        return out
