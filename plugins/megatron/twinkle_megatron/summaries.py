"""One call's loss summary from its micro-batches' (`schedule.run` infos): combined on this rank by each micro-batch's
share of the batch, then reduced over the data-parallel group to the global batch's."""

from __future__ import annotations

from typing import Any

from twinkle_core.runtime.distributed import all_reduce_sum
from twinkle_megatron import groups

COUNTS = ('num_loss_tokens', 'num_correct', 'num_tokens')


def combine(parts: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """One rank's micro-batch summaries (share, info) -> the call's: the loss weighted by share, counts summed."""
    summary = {'loss': sum(share * info['loss'] for share, info in parts)}
    for key in COUNTS:
        summary[key] = sum(info['summary'][key] for _, info in parts)
    return summary


def reduce_over_dp(summary: dict[str, Any], reduction: str | None, weight: float) -> dict[str, Any]:
    """This data rank's summary (its batch weighing `weight`) -> the global batch's (collective over the
    data-parallel group): a summed loss is summed, a mean one weighted by each rank's share; counts are summed."""
    sums = all_reduce_sum([summary['loss'] * weight, weight, *(float(summary[k]) for k in COUNTS)], groups.dp_group())
    if reduction == 'sum':
        loss = all_reduce_sum([summary['loss']], groups.dp_group())[0]
    else:
        loss = sums[0] / sums[1] if sums[1] else 0.0
    return {**summary, 'loss': loss, **{k: int(round(v)) for k, v in zip(COUNTS, sums[2:])}}


def share_weighted_metrics(parts: list[tuple[float, dict[str, Any]]]) -> dict[str, float]:
    """The micro-batches' numeric metrics, averaged by their share (this rank's)."""
    metrics: dict[str, float] = {}
    total_share = sum(share for share, _ in parts) or 1.0
    for share, info in parts:
        for k, v in info['metrics'].items():
            if isinstance(v, (int, float)):
                metrics[k] = metrics.get(k, 0.0) + v * share / total_share
    return metrics
