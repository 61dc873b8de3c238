"""A training or evaluation step of `MegatronModel` on this rank (`run`): micro-batches through the pipeline schedule,
and the call's loss summary reduced over the data-parallel group (`summaries`)."""

from __future__ import annotations

from typing import Any, Protocol

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
    rows = as_input_features(inputs)
    check_row_lengths(rows, model.max_length, 'max_length of the model')
    if micro_batch_size is not None:
        parts = micro_batches(rows, micro_batch_size)
    else:
        parts = [p for p in split_for_dp(rows, min(len(rows), model.layout.pp)) if p]
    batches = [state.processor(p, device=model.device) for p in parts]
    reduction = getattr(state.loss, 'reduction', None)
    weights, local_weight = micro_batch_shares(reduction, batches)
    (total_weight,) = all_reduce_sum([local_weight], groups.dp_group())
    dp_share = 1.0 if reduction == 'sum' else (local_weight / total_weight if total_weight else 0.0)
    micro = [schedule.MicroBatch(b, w) for b, w in zip(batches, weights)]
    for chunk in unit.chunks:
        chunk.train(training)
    with unit.scope():
        infos = schedule.run(
            unit.chunks,
            micro,
            loss=state.loss,
            outputs=model.row_outputs,
            scale=state.loss_scale() * dp_share,
            forward_only=not training,
            compute_loss=compute_loss,
            pad_token_id=model.pad_token_id,
            pad_multiple=model.layout.tp if model.layout.sp else 1,
            same_shape_group=groups.dp_group() if model.layout.ep > 1 else None,
        )
    keys = model.row_outputs.row_keys
    result: dict[str, Any] = {key: [row for info in infos for row in info[key]] for key in keys}
    with_loss = [(m, info) for m, info in zip(micro, infos) if 'loss' in info]
    if with_loss:
        shares = [(m.share, info) for m, info in with_loss]
        summary = summaries.reduce_over_dp(summaries.combine(shares), reduction, local_weight)
        state.record(summary, is_training=training)
        result.update(loss=summary['loss'], metrics=summaries.share_weighted_metrics(shares))
    return result
