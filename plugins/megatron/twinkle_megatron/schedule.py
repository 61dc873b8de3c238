"""One training or evaluation pass through Megatron's pipeline schedule, with twinkle's losses.

A call's rows (this data rank's share) are cut into micro-batches, each collated by the adapter's processor
(padding or padding-free). Megatron's schedules need one tensor shape for every micro-batch, so the model sees
each one padded to the call's widest row count and length (rounded to a multiple of tp under sequence
parallelism). Right-padded rows need nothing but causal attention (a real token never sees the padding after
it); a padding-free batch gets an explicit mask: causal within each packed sequence. The loss sees the
micro-batch exactly as collated (the padded rows and positions are cut from the logits first), so every twinkle
loss, processor and metric works unchanged.

On the last pipeline stage each micro-batch's loss is computed from vocabulary-parallel log-probs
(`twinkle_megatron.logps`; a value model's head gives values instead: `ScalarValues`) and backpropagated with
the factor `scale * share` (accumulation, data-parallel weighting, the micro-batch's part of the call). What the
loss reports travels back to every pipeline stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from twinkle_core.errors import InvalidInputError
from twinkle_core.train.loss_step import rows_logprobs, run_loss, summary_from_values, summary_values
from twinkle_core.train.value_head import check_value_loss, value_row_outputs
from twinkle_core.types import IGNORE_INDEX
from twinkle_megatron import groups
from twinkle_megatron.logps import full_logits, vocab_parallel_argmax, vocab_parallel_logps


@dataclass
class MicroBatch:
    """A collated micro-batch (`batch`, what the loss sees), what its loss is and how it is scaled, and the
    fixed-shape tensors the model runs on. In a mixed call each micro-batch is one adapter's (`adapter`)."""

    batch: dict[str, Any]
    share: float  # this micro-batch's part of its adapter's loss in the call
    loss: Any  # the adapter's twinkle loss
    scale: float = 1.0  # times the loss before backward besides `share` (accumulation, data-parallel weighting)
    adapter: str | None = None  # activated before the forward (a mixed call); None: as the caller set it
    model_inputs: dict[str, torch.Tensor | None] | None = None


def attention_mask(row_index: torch.Tensor) -> torch.Tensor:
    """Megatron's boolean mask ``[B, 1, S, S]`` (True = masked) from the per-token row index (-1: padding):
    causal, within one row or packed sequence; padding attends to itself only (keeps the softmax finite)."""
    s = row_index.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=row_index.device).tril()
    same = row_index.unsqueeze(-1) == row_index.unsqueeze(-2)
    real = (row_index >= 0).unsqueeze(-2)
    eye = torch.eye(s, dtype=torch.bool, device=row_index.device)
    allowed = causal & same & (real | eye)
    return ~allowed.unsqueeze(1)


def pad_model_inputs(
    micro: list[MicroBatch], *, multiple: int, pad_token_id: int, same_shape_group: Any = None
) -> tuple[int, int]:
    """Give every micro-batch fixed-shape model inputs; returns (rows, length) of that shape. `same_shape_group`:
    ranks that must all use one shape (expert parallelism gathers tokens across the data-parallel ranks)."""
    rows = max(len(m.batch['row_lengths']) for m in micro)
    width = max(m.batch['input_ids'].shape[1] for m in micro)
    if same_shape_group is not None:
        shape = torch.tensor([rows, width, len(micro)])
        dist.all_reduce(shape, op=dist.ReduceOp.MAX, group=same_shape_group)
        rows, width = int(shape[0]), int(shape[1])
        if int(shape[2]) != len(micro):
            raise InvalidInputError(
                f'Under expert parallelism every data-parallel rank must run the same number '
                f'of micro-batches; this rank has {len(micro)}, another {int(shape[2])}. '
                f'Give every rank the same number of rows.'
            )
    width = -(-width // multiple) * multiple
    for m in micro:
        ids, pos, index = m.batch['input_ids'], m.batch['position_ids'], m.batch['row_index']
        b, s = ids.shape
        size = (rows, width)
        full_ids = ids.new_full(size, pad_token_id)
        full_pos = torch.arange(width, device=ids.device).expand(size).clone()
        full_index = index.new_full(size, -1)
        full_ids[:b, :s], full_pos[:b, :s], full_index[:b, :s] = ids, pos, index
        packed = bool(m.batch.get('packed'))  # padded rows need no mask: causal attention never sees padding
        m.model_inputs = {
            'input_ids': full_ids,
            'position_ids': full_pos,
            'attention_mask': attention_mask(full_index) if packed else None,
        }
    return rows, width


class TokenLogprobs:
    """What the language-model head gives the loss and the caller: per-token log-probs from vocabulary-parallel
    logits. `loss_outputs`: the loss's ``outputs`` dict (``target_logps``, ``logps``, ``mask``, ``correct``, and
    ``logits`` when the loss asks for them), cut to the collated shape; `kept`: the device tensor kept per
    micro-batch until the schedule is done; `rows`: the per-row results made of it (``logprobs``)."""

    row_keys = ('logprobs',)

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def loss_outputs(self, logits: torch.Tensor, batch: dict[str, Any], loss: Any) -> dict[str, Any]:
        b, s = batch['input_ids'].shape
        logits = logits[:b, :s]
        group = groups.tp_group()
        target_logps = vocab_parallel_logps(logits, batch['target_ids'], self.vocab_size, group)
        labels = batch['labels']
        mask = labels != IGNORE_INDEX
        outputs: dict[str, Any] = {
            'target_logps': target_logps,
            'logps': torch.where(mask, target_logps, 0.0),
            'mask': mask,
            'correct': (vocab_parallel_argmax(logits, self.vocab_size, group) == labels) & mask,
        }
        if getattr(loss, 'needs_logits', False):
            outputs['logits'] = full_logits(logits, self.vocab_size, group)
        return outputs

    def kept(self, outputs: dict[str, Any]) -> torch.Tensor:
        return outputs['target_logps'].detach()

    def rows(self, batch: dict[str, Any], kept: torch.Tensor) -> dict[str, list[Any]]:
        return {'logprobs': rows_logprobs(batch, kept)}


class ScalarValues:
    """What a value model's scalar head (`twinkle_megatron.value_head`) gives: ``values`` [B, T] at every position
    for the loss (which must read values), per-row ``values`` and ``scores`` for the caller."""

    row_keys = ('values', 'scores')

    def loss_outputs(self, head: torch.Tensor, batch: dict[str, Any], loss: Any) -> dict[str, Any]:
        check_value_loss(loss)
        b, s = batch['input_ids'].shape
        mask = batch['labels'] != IGNORE_INDEX
        return {'values': head[:b, :s, 0].float(), 'mask': mask, 'correct': torch.zeros_like(mask)}

    def kept(self, outputs: dict[str, Any]) -> torch.Tensor:
        return outputs['values'].detach()

    def rows(self, batch: dict[str, Any], kept: torch.Tensor) -> dict[str, list[Any]]:
        return value_row_outputs(batch, kept)


RowOutputs = TokenLogprobs | ScalarValues


def run(
    chunks: list[Any],
    micro: list[MicroBatch],
    *,
    outputs: RowOutputs,
    forward_only: bool,
    compute_loss: bool,
    pad_token_id: int,
    pad_multiple: int,
    same_shape_group: Any = None,
    activate: Callable[[str | None], None] | None = None,
) -> list[dict[str, Any]]:
    """Run `micro` through the pipeline; returns, on every rank, each micro-batch's per-row results (`outputs`:
    ``logprobs``, or a value model's ``values`` and ``scores``) and ``loss``, ``summary``, ``metrics`` where a loss
    was computed, or ``loss_error`` (the exception) where the loss raised: that micro-batch then backpropagates
    nothing, and the schedule completes on every rank (a raise on the last stage alone would leave the other
    stages waiting). Backward runs unless `forward_only`.
    `pad_multiple`: the model's sequence length is a multiple of it (tp under sequence parallelism);
    `same_shape_group`: see `pad_model_inputs`; `activate(adapter)`: called before each micro-batch's forward
    with its `MicroBatch.adapter` (a mixed call)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    rows, width = pad_model_inputs(
        micro, multiple=pad_multiple, pad_token_id=pad_token_id, same_shape_group=same_shape_group
    )

    def forward_step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Callable[..., Any]]:
        m = next(data_iterator)
        if activate is not None:
            activate(m.adapter)
        output = model(**m.model_inputs)
        return output, lambda logits: _loss(m, logits)

    def _loss(m: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        produced = outputs.loss_outputs(logits, m.batch, m.loss)
        # device tensors only: fetched (`_fetch`) once the whole schedule, backward included, is queued
        info: dict[str, Any] = {'batch': m.batch, 'kept': outputs.kept(produced)}
        value = logits.sum() * 0.0  # keeps the graph when no loss is computed
        if compute_loss and bool(produced['mask'].any()):
            try:
                result = run_loss(m.loss, m.batch, produced)
            except Exception as exc:  # noqa: BLE001 - raised after the schedule, on every pipeline stage
                info['loss_error'] = exc
                return value, torch.ones((), dtype=torch.int), info
            value = result['loss'] * (m.scale * m.share)
            info.update(metrics=dict(result.get('metrics') or {}), summary=summary_values(produced, result['loss']))
        return value, torch.ones((), dtype=torch.int), info

    iterators: Any = [iter(micro) for _ in chunks] if len(chunks) > 1 else iter(micro)
    infos = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iterators,
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=len(micro),
        seq_length=width,
        micro_batch_size=rows,
        forward_only=forward_only,
    )
    return _from_last_stage([_fetch(info, outputs) for info in infos])


def _fetch(info: dict[str, Any], outputs: RowOutputs) -> dict[str, Any]:
    """A micro-batch's host-side results (per-row results, and ``loss``/``summary``/``metrics`` where a loss ran)
    from the device tensors `_loss` kept."""
    batch = info.pop('batch', None)
    if batch is None:  # not the last pipeline stage: nothing computed here
        return info
    out: dict[str, Any] = {**outputs.rows(batch, info.pop('kept')), **info}
    if 'summary' in out:
        out['summary'] = summary_from_values(batch, out['summary'].tolist())
        out['loss'] = out['summary']['loss']
    return out


def _from_last_stage(infos: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last pipeline stage's per-micro-batch results, on every stage of the pipeline."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return infos
    box = [infos if ps.is_pipeline_last_stage() else None]
    dist.broadcast_object_list(box, src=ps.get_pipeline_model_parallel_last_rank(), group=groups.pp_group())
    received = box[0]
    assert received is not None  # the last stage broadcast its list
    return received
