"""The policy-gradient training step of an RL run, and the off-policy statistics it reports.

`PolicyGradientStep` is the `train_step` an `AsyncRLDriver` calls: it trains the groups' rows with their
advantages (one ``forward_backward`` with the model's loss -- e.g. ``GRPOLoss``, whose clipped ratio against the
rows' ``old_logps`` corrects for sampling by an older policy -- then ``clip_grad_and_step``) and returns the mean
reward, the loss's metrics (``clip_frac``: the fraction of tokens the ratio clip bound; with ``tis_cap``,
``is_truncated_frac``) and `importance_ratio_stats`: how the per-token importance ratio between the trained
policy and the behaviour policy that sampled the tokens is distributed.
"""

from __future__ import annotations

import math
from statistics import fmean
from typing import Any, Callable, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.rl.rollout_group import RolloutGroup, rows_with_advantages

IS_RATIO_QUANTILES = (0.05, 0.5, 0.95)


def quantile_key(q: float) -> str:
    """The metric name of the ratio's `q` quantile: ``is_ratio_p05`` for 0.05."""
    return f'is_ratio_p{round(q * 100):02d}'


def importance_ratio_stats(rows: Sequence[dict[str, Any]], logprobs: Sequence[Sequence[float]]) -> dict[str, float]:
    """The distribution of ``exp(logprob - old_logp)`` over the trained tokens (``labels != -100``) of `rows`.

    `logprobs`: the trainer's per-token log-probs of each row, aligned with its ``input_ids`` (what
    ``forward_backward`` returns); each row's ``old_logps``: the behaviour policy's, aligned the same way. Returns
    ``is_ratio_mean``, ``is_ratio_min``, ``is_ratio_p05``, ``is_ratio_p50``, ``is_ratio_p95``, ``is_ratio_max`` and
    ``is_abs_log_ratio_mean`` (0 exactly when the two policies agree on every token); an empty dict when no row
    has a trained token. Raises `InvalidInputError` for a row without ``old_logps``/``labels`` or of another length.
    """
    if len(rows) != len(logprobs):
        raise InvalidInputError(f'importance_ratio_stats: {len(rows)} rows but {len(logprobs)} log-prob lists.')
    log_ratios: list[float] = []
    for index, (row, current) in enumerate(zip(rows, logprobs)):
        old, labels = row.get('old_logps'), row.get('labels')
        if old is None or labels is None:
            raise InvalidInputError(f'importance_ratio_stats: row {index} has no old_logps or no labels.')
        if not len(old) == len(labels) == len(current):
            raise InvalidInputError(
                f'importance_ratio_stats: row {index} has {len(labels)} labels, {len(old)} old_logps and '
                f'{len(current)} log-probs; all three are aligned with input_ids.'
            )
        log_ratios.extend(float(c) - float(o) for c, o, label in zip(current, old, labels) if label != -100)
    if not log_ratios:
        return {}
    ratios = sorted(math.exp(x) for x in log_ratios)
    stats = {'is_ratio_mean': fmean(ratios), 'is_ratio_min': ratios[0], 'is_ratio_max': ratios[-1]}
    for q in IS_RATIO_QUANTILES:
        stats[quantile_key(q)] = _quantile(ratios, q)
    stats['is_abs_log_ratio_mean'] = fmean(abs(x) for x in log_ratios)
    return stats


def summarize_off_policy(step_metrics: Sequence[dict[str, Any]]) -> dict[str, float]:
    """A run's off-policy figures from its steps' metrics: the mean over the steps of the ratio's mean, quantiles,
    mean |log ratio| and of the loss's ``clip_frac`` / ``is_truncated_frac``; the smallest ``is_ratio_min`` and the
    largest ``is_ratio_max``. Keys no step reported are left out."""

    def reported(key: str) -> list[float]:
        return [float(m[key]) for m in step_metrics if key in m]

    mean_keys = ['is_ratio_mean', *(quantile_key(q) for q in IS_RATIO_QUANTILES)]
    mean_keys += ['is_abs_log_ratio_mean', 'clip_frac', 'is_truncated_frac']
    summary = {key: fmean(values) for key in mean_keys if (values := reported(key))}
    if lows := reported('is_ratio_min'):
        summary['is_ratio_min'] = min(lows)
    if highs := reported('is_ratio_max'):
        summary['is_ratio_max'] = max(highs)
    return summary


def off_policy_line(summary: dict[str, float]) -> str:
    """One line of a `summarize_off_policy` (or `RunReport.summary`) result: the IS ratio quantiles, extremes,
    mean |log ratio| and the clipped fraction ('n/a' for what it lacks)."""

    def show(key: str, spec: str = '.3f') -> str:
        return format(summary[key], spec) if key in summary else 'n/a'

    quantiles = '/'.join(show(quantile_key(q)) for q in IS_RATIO_QUANTILES)
    return (
        f'IS ratio p05/p50/p95 {quantiles}, min/max {show("is_ratio_min")}/{show("is_ratio_max")}, '
        f'mean |log ratio| {show("is_abs_log_ratio_mean", ".4f")}, clipped {show("clip_frac", ".2%")}'
    )


class PolicyGradientStep:
    """``step(groups, step_index) -> metrics``: one optimizer step on `groups` (an `AsyncRLDriver` `TrainStep`).

    The rows get their advantage from ``advantage_fn(rewards, group_size=...)`` (e.g. ``GRPOAdvantage``) per group;
    the model trains them with its loss (set it first: ``model.set_loss('GRPOLoss', ...)``) on `adapter_name`, then
    clips the gradient norm to `max_norm` and steps. `micro_batch_size`: rows per forward/backward pass (for a model
    that takes it, e.g. `TransformersModel`: the gradients equal one pass, the activations are those of one
    micro-batch); None: all rows in one pass. The metrics: ``reward`` (the mean over the groups' rollouts),
    the loss's metrics and `importance_ratio_stats` of the rows (when they carry the behaviour ``old_logps``).
    """

    def __init__(
        self,
        model: Any,
        advantage_fn: Callable[..., list[float]],
        *,
        max_norm: float | None = 1.0,
        adapter_name: str | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        self.model, self.advantage_fn = model, advantage_fn
        self.max_norm, self.adapter_name, self.micro_batch_size = max_norm, adapter_name, micro_batch_size

    def __call__(self, groups: list[RolloutGroup], step: int) -> dict[str, Any]:
        rows = rows_with_advantages(groups, self.advantage_fn)
        adapter = {} if self.adapter_name is None else {'adapter_name': self.adapter_name}
        passes = {} if self.micro_batch_size is None else {'micro_batch_size': self.micro_batch_size}
        result = self.model.forward_backward(inputs=rows, **adapter, **passes)
        self.model.clip_grad_and_step(max_norm=self.max_norm, **adapter)
        metrics = {'reward': fmean(r for group in groups for r in group.rewards), **result.get('metrics', {})}
        if all(row.get('old_logps') is not None for row in rows):  # else: on-policy rows, no ratio to report
            metrics.update(importance_ratio_stats(rows, result['logprobs']))
        return metrics


def _quantile(ordered: list[float], q: float) -> float:
    """The `q` quantile of the sorted values, interpolated linearly between the two nearest ranks."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
