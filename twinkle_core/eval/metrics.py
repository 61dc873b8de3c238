"""Evaluation metrics with their uncertainty: accuracy with a Wilson interval, the unbiased pass@k estimator, means
with a normal-approximation interval.

pass@k (Chen et al., 2021, "Evaluating Large Language Models Trained on Code"): with n samples of a prompt of which
c are correct, ``1 - C(n - c, k) / C(n, k)`` is the unbiased estimate of the chance that at least one of k samples is
correct; the task's pass@k is its mean over prompts.
"""

from __future__ import annotations

import math
from typing import Sequence

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile: two-sided 95 % intervals


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with `n` samples, `c` of them correct (1 <= k <= n)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f'pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}')
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (sound near 0 and 1, where the normal one is not)."""
    if trials <= 0:
        return (0.0, 1.0)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_interval(values: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its normal-approximation interval (standard error of the sample)."""
    n = len(values)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    mean = sum(values) / n
    if n == 1:
        return (mean, mean, mean)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = z * sd / math.sqrt(n)
    return (mean, mean - half, mean + half)


def summarize(
    correct: Sequence[Sequence[bool]],
    rewards: Sequence[Sequence[float]],
    formatted: Sequence[Sequence[bool]],
    lengths: Sequence[Sequence[int]],
) -> dict[str, float]:
    """The metrics of a run: per prompt, its samples' correctness, rewards, format flags and lengths (tokens).

    ``accuracy`` (= pass@1: the mean correctness of a sample) with ``accuracy_low/high`` (Wilson over prompts with one
    sample each; else the normal interval of the per-prompt means), ``pass@k`` for k = 1, 2, 4, ... up to the
    samples per prompt, ``mean_reward`` with its interval, ``format_rate``, ``mean_length``, ``prompts``, ``samples``.
    """
    n_prompts = len(correct)
    samples = min((len(c) for c in correct), default=0)
    if n_prompts == 0 or samples == 0:
        raise ValueError('nothing to summarize: no prompts, or a prompt without samples')
    per_prompt = [sum(c[:samples]) / samples for c in correct]
    accuracy = sum(per_prompt) / n_prompts
    if samples == 1:
        low, high = wilson_interval(sum(bool(c[0]) for c in correct), n_prompts)
    else:
        _, low, high = mean_interval(per_prompt)
    out = {'accuracy': accuracy, 'accuracy_low': max(0.0, low), 'accuracy_high': min(1.0, high)}
    k = 1
    while k <= samples:
        out[f'pass@{k}'] = sum(pass_at_k(samples, sum(c[:samples]), k) for c in correct) / n_prompts
        k *= 2
    flat_rewards = [r for rs in rewards for r in rs]
    out['mean_reward'], out['mean_reward_low'], out['mean_reward_high'] = mean_interval(flat_rewards)
    flat_format = [f for fs in formatted for f in fs]
    out['format_rate'] = sum(flat_format) / len(flat_format)
    flat_lengths = [n for ns in lengths for n in ns]
    out['mean_length'] = sum(flat_lengths) / len(flat_lengths)
    out['prompts'], out['samples'] = float(n_prompts), float(samples)
    return out
