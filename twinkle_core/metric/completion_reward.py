"""`CompletionRewardMetric`: reward and completion-length statistics of sampled completions (torch-free)."""

from __future__ import annotations

import math
from statistics import fmean, pstdev
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.metric.base import Metric


class CompletionRewardMetric(Metric):
    """Accumulates rewards (one float per completion) and optional completion lengths (tokens per completion),
    given as ``outputs['rewards']`` / ``outputs['completion_lengths']`` or as keywords. Rewards may be one list or
    several named ones (``rewards={'total': [...], 'format': [...]}``, as the Twinkle documents pass them). With
    ``group_size`` (at init or per call) it also reports the fraction of groups whose rewards (the first named
    series) are all equal -- those give GRPO no learning signal.

    `calculate` returns ``reward/mean|std|min|max`` (``reward/<name>/...`` per named series),
    ``completion_length/mean|min|max`` and ``reward/zero_std_group_frac`` when known.
    """

    def __init__(self, group_size: int | None = None) -> None:
        self.group_size = group_size
        self.reset()

    def reset(self) -> None:
        self.rewards: dict[str | None, list[float]] = {}  # series name (None: unnamed) -> rewards
        self.lengths: list[int] = []
        self.groups = self.flat_groups = 0

    def accumulate(
        self,
        inputs: Any = None,
        outputs: dict[str, Any] | None = None,
        *,
        rewards: Any = None,
        completion_lengths: Any = None,
        group_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs:  # the interface allows extra keywords; this metric reads none
            raise TypeError(f'CompletionRewardMetric.accumulate() got unexpected keyword arguments {sorted(kwargs)}.')
        outputs = outputs or {}
        given = outputs.get('rewards', rewards)
        series = {
            name: _finite(values, name)
            for name, values in (given.items() if isinstance(given, dict) else [(None, given or [])])
        }
        counts = {len(v) for v in series.values()}
        if len(counts) > 1:
            raise InvalidInputError(f'CompletionRewardMetric: the named rewards have different lengths {counts}.')
        first = next(iter(series.values()), [])
        lengths = outputs.get('completion_lengths', completion_lengths)
        if lengths is not None:
            if len(lengths) != len(first):
                raise InvalidInputError(
                    f'CompletionRewardMetric: {len(lengths)} completion_lengths for '
                    f'{len(first)} rewards; give one length per completion.'
                )
            self.lengths.extend(int(n) for n in lengths)
        group_size = group_size or self.group_size
        if group_size:
            if len(first) % group_size:
                raise InvalidInputError(
                    f'CompletionRewardMetric: {len(first)} rewards are not a multiple of group_size={group_size}.'
                )
            for start in range(0, len(first), group_size):
                self.groups += 1
                self.flat_groups += len(set(first[start : start + group_size])) == 1
        for name, values in series.items():
            self.rewards.setdefault(name, []).extend(values)

    def calculate(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, values in self.rewards.items():
            if values:
                prefix = 'reward' if name is None else f'reward/{name}'
                out.update(
                    {
                        f'{prefix}/mean': fmean(values),
                        f'{prefix}/std': pstdev(values),
                        f'{prefix}/min': min(values),
                        f'{prefix}/max': max(values),
                    }
                )
        if self.lengths:
            out.update(
                {
                    'completion_length/mean': fmean(self.lengths),
                    'completion_length/min': float(min(self.lengths)),
                    'completion_length/max': float(max(self.lengths)),
                }
            )
        if self.groups:
            out['reward/zero_std_group_frac'] = self.flat_groups / self.groups
        return out


def _finite(values: Any, name: str | None) -> list[float]:
    out = [float(r) for r in values]
    if any(not math.isfinite(r) for r in out):
        raise InvalidInputError(
            f'CompletionRewardMetric: rewards{"" if name is None else f" {name!r}"} must be finite.'
        )
    return out
