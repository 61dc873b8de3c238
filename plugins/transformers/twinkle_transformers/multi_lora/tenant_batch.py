"""One tenant's share of a mixed batch: validating its rows up front, and slicing its rows back out.

Rows of a mixed step are collated tenant after tenant, so a tenant's rows are contiguous: rows
``[start, end)`` of a padded batch, or positions ``[sum(lengths[:start]), sum(lengths[:end]))`` of a packed one.
`slice_rows` cuts every per-token tensor, per-row field and bookkeeping field (``row_index`` re-based to 0,
``row_lengths``, ``num_tokens``, ``cu_seqlens``, ``max_seqlen``) so the tenant's loss sees exactly the batch it
would see alone.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Callable

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import IGNORE_INDEX, as_input_features, as_list

# What the processor itself adds to every batch (everything else comes from the rows' own fields).
COLLATED_FIELDS = frozenset(
    {
        'input_ids',
        'labels',
        'target_ids',
        'position_ids',
        'attention_mask',
        'row_index',
        'row_lengths',
        'num_tokens',
        'packed',
        'cu_seqlens',
        'max_seqlen',
    }
)


@dataclass(frozen=True)
class RowLimits:
    """What a row must satisfy to be fed to the model."""

    vocab_size: int
    max_length: int | None = None


def validate_rows(batch: Any, limits: RowLimits) -> list[dict[str, Any]]:
    """Rows as dicts, checked so that they cannot break a shared forward: valid `InputFeature`s, token ids in
    ``[0, vocab_size)``, labels in that range or -100, lengths within `max_length`. Raises `InvalidInputError`
    naming the row and what to fix."""
    rows = as_input_features(batch)
    for i, row in enumerate(rows):
        ids = _ints(row['input_ids'], i, 'input_ids')
        if limits.max_length is not None and len(ids) > limits.max_length:
            raise InvalidInputError(f'row {i} has {len(ids)} tokens; the model accepts at most {limits.max_length}.')
        bad = next((t for t in ids if not 0 <= t < limits.vocab_size), None)
        if bad is not None:
            raise InvalidInputError(
                f'row {i}: input_ids contains {bad}, outside the vocabulary [0, {limits.vocab_size}).'
            )
        if row.get('labels') is not None:
            labels = _ints(row['labels'], i, 'labels')
            bad = next((t for t in labels if t != IGNORE_INDEX and not 0 <= t < limits.vocab_size), None)
            if bad is not None:
                raise InvalidInputError(
                    f'row {i}: labels contains {bad}; use token ids in [0, {limits.vocab_size})'
                    f' or {IGNORE_INDEX} for no loss.'
                )
    return rows


def _ints(values: Any, row: int, field: str) -> list[int]:
    values = as_list(values)
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
        raise InvalidInputError(f'row {row}: {field} must be integers.')
    return values


def slice_rows(batch: dict[str, Any], start: int, end: int, row_fields: set[str]) -> dict[str, Any]:
    """The sub-batch of rows ``[start, end)`` of a batch collated by `CausalLMProcessor` (padded or packed).

    Only the fields these rows carry (`row_fields`) are kept besides the collated ones: a per-token field of
    another tenant (filled with zeros for these rows by the collation) must not reach this tenant's loss.
    """
    lengths: list[int] = batch['row_lengths']
    num_rows, packed = len(lengths), bool(batch.get('packed'))
    shape = tuple(batch['input_ids'].shape)
    cut = _token_slicer(batch, start, end)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key not in COLLATED_FIELDS and key not in row_fields:
            continue
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and tuple(value.shape[:2]) == shape:
            out[key] = cut(value)
        elif (
            isinstance(value, torch.Tensor) and value.dim() == 1 and value.shape[0] == num_rows and key != 'cu_seqlens'
        ):
            out[key] = value[start:end]
        elif isinstance(value, list) and len(value) == num_rows:
            out[key] = value[start:end]
        else:
            out[key] = value
    sub = lengths[start:end]
    out['row_lengths'], out['num_tokens'] = sub, sum(sub)
    if 'row_index' in out:
        ri = out['row_index']
        out['row_index'] = torch.where(ri >= 0, ri - start, ri)
    if packed:
        cu = torch.zeros(len(sub) + 1, dtype=torch.int32, device=batch['input_ids'].device)
        cu[1:] = torch.tensor(sub, device=cu.device).cumsum(0)
        out.update(cu_seqlens=cu, max_seqlen=max(sub))
    return out


#: forward outputs that are not per token, shared by every row as they are (`forward_logps`)
WHOLE_BATCH_OUTPUTS = frozenset({'output_weight'})


def slice_outputs(
    outputs: dict[str, torch.Tensor], batch: dict[str, Any], start: int, end: int
) -> dict[str, torch.Tensor]:
    """The forward outputs (``logps``, ``mask``, ``logits``, ...) of rows ``[start, end)``, laid out like
    `slice_rows` lays out the batch."""
    cut = _token_slicer(batch, start, end)
    return {k: v if k in WHOLE_BATCH_OUTPUTS else cut(v) for k, v in outputs.items()}


def _token_slicer(batch: dict[str, Any], start: int, end: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Cuts a [B, T, ...] tensor down to rows [start, end): packed -> their positions; padded -> their rows,
    trimmed to their longest row (extra padding columns dropped)."""
    lengths: list[int] = batch['row_lengths']
    if batch.get('packed'):
        p0, p1 = sum(lengths[:start]), sum(lengths[:end])
        return lambda t: t[:, p0:p1]
    width = max(lengths[start:end])
    return lambda t: t[start:end, :width]
