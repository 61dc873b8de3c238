"""A training or evaluation step of `MegatronModel` on this rank (`run`): micro-batches through the pipeline schedule,
and the call's loss summary reduced over the data-parallel group (`summaries`). Its pieces (`collate`,
`run_schedule`, `tenant_result`) are also each tenant's part of a mixed call (`twinkle_megatron.mixed_step`)."""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from twinkle_core.mesh import split_for_dp
from twinkle_core.runtime.distributed import all_reduce_sum
from twinkle_core.train.loss_step import micro_batch_shares
from twinkle_core.train.row_keywords import check_row_lengths, micro_batches
from twinkle_core.types import as_input_features
from twinkle_megatron import groups, schedule, summaries
from twinkle_megatron.architecture import Architecture, Layout
from twinkle_megatron.units import TrainingUnit


class StepModel(Protocol):
    """What a step reads of its model (`MegatronModel`)."""

    max_length: int
    layout: Layout
    device: torch.device
    arch: Architecture
    pad_token_id: int
    row_outputs: schedule.RowOutputs  # what the output layer gives: log-probs, or a value head's values


def run(
    model: StepModel,
    unit: TrainingUnit,
    inputs: Any,
    micro_batch_size: int | None,
    *,
    training: bool,
    compute_loss: bool,
) -> dict[str, Any]:
    """One forward (and backward when `training`) of `unit` over `inputs` on this rank's chunks: the rows split in
    micro-batches (`micro_batch_size`, default one per pipeline stage), the pipeline schedule, the loss summary
    recorded in the unit's state. Returns the per-row results (``logprobs``, or a value model's ``values`` and
    ``scores``) and, where rows had labels, ``loss`` and ``metrics``."""
    unit.wrap()
    state = unit.state
    batches, shares, local_weight = collate(model, unit, inputs, micro_batch_size)
    (total_weight,) = all_reduce_sum([local_weight], groups.dp_group())
    scale = state.loss_scale() * dp_share(unit, local_weight, total_weight)
    micro = [schedule.MicroBatch(b, s, state.loss, scale) for b, s in zip(batches, shares)]
    with unit.scope():
        infos = run_schedule(model, unit.chunks, micro, training=training, compute_loss=compute_loss)
    for info in infos:
        if 'loss_error' in info:
            raise info['loss_error']
    result, summary = tenant_result(model, unit, micro, infos, local_weight, reduce=any('loss' in i for i in infos))
    if summary is not None:
        state.record(summary, is_training=training)
    return result


def collate(
    model: StepModel, unit: TrainingUnit, inputs: Any, micro_batch_size: int | None
) -> tuple[list[dict[str, Any]], list[float], float]:
    """`inputs` (this rank's rows) checked and collated by `unit`'s processor into micro-batches (`micro_batch_size`
    rows each, default one per pipeline stage): (micro-batches, each one's share of the call's loss, this rank's
    loss weight: loss tokens, rows, or 1 for a summed loss)."""
    rows = as_input_features(inputs)
    check_row_lengths(rows, model.max_length, 'max_length of the model')
    if micro_batch_size is not None:
        parts = micro_batches(rows, micro_batch_size)
    else:
        parts = [p for p in split_for_dp(rows, min(len(rows), model.layout.pp)) if p]
    batches = [unit.state.processor(p, device=model.device) for p in parts]
    shares, local_weight = micro_batch_shares(getattr(unit.state.loss, 'reduction', None), batches)
    return batches, shares, local_weight


def dp_share(unit: TrainingUnit, local_weight: float, total_weight: float) -> float:
    """This data rank's part of the call's loss (1 for a summed loss)."""
    if getattr(unit.state.loss, 'reduction', None) == 'sum':
        return 1.0
    return local_weight / total_weight if total_weight else 0.0


def run_schedule(
    model: StepModel,
    chunks: list[Any],
    micro: list[schedule.MicroBatch],
    *,
    training: bool,
    compute_loss: bool,
    activate: Callable[[str | None], None] | None = None,
) -> list[dict[str, Any]]:
    """`micro` through the pipeline schedule of `chunks` (`schedule.run`), in train or eval mode."""
    for chunk in chunks:
        chunk.train(training)
    return schedule.run(
        chunks,
        micro,
        outputs=model.row_outputs,
        forward_only=not training,
        compute_loss=compute_loss,
        pad_token_id=model.pad_token_id,
        pad_multiple=model.layout.tp if model.layout.sp else 1,
        same_shape_group=groups.dp_group() if model.layout.ep > 1 else None,
        activate=activate,
    )


def tenant_result(
    model: StepModel,
    unit: TrainingUnit,
    micro: list[schedule.MicroBatch],
    infos: list[dict[str, Any]],
    local_weight: float,
    *,
    reduce: bool,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the per-row results of `unit`'s micro-batches `micro` (their schedule `infos`), plus ``loss`` and
    ``metrics`` when reduced; the global batch's summary when reduced, else None). `reduce`: reduce the summary
    over the data-parallel group -- a collective, so every data rank passes the same (a rank without rows or
    loss contributes nothing)."""
    result: dict[str, Any] = {key: [row for info in infos for row in info[key]] for key in model.row_outputs.row_keys}
    if not reduce:
        return result, None
    shares = [(m.share, info) for m, info in zip(micro, infos) if 'loss' in info]
    summary = summaries.reduce_over_dp(
        summaries.combine(shares), getattr(unit.state.loss, 'reduction', None), local_weight
    )
    result.update(loss=summary['loss'], metrics=summaries.share_weighted_metrics(shares))
    return result, summary
