"""`CausalLMProcessor`: collate `InputFeature` rows for a causal LM -- right padding or padding-free packing.

Output batch (every tensor [B, T]; packed batches have B = 1 and hold all rows back to back):

- ``input_ids``, ``position_ids`` (restarting at 0 for each row), ``attention_mask`` (padded only; None when
  packed -- attention then never crosses a row border: transformers derives the block-diagonal causal mask from
  the restarting ``position_ids``, flash-attention uses ``cu_seqlens``);
- ``labels`` **shifted once**: ``labels[:, t]`` is the token predicted by the logits at t; -100 at each row's last
  position and on padding;
- ``target_ids``: like ``labels`` but set wherever a next token exists (the label where one is given, else the
  next input token), so forward passes can return log-probs of every input token;
- per-token fields (any other numeric list as long as the row's ``input_ids``: ``weights``, ``advantages``,
  ``old_logps`` ...) shifted the same way, float32, 0 at row ends and padding;
- ``row_index``: the row each position belongs to (-1 on padding); every field named in
  `per_row_index_fields` (default ``adapter_index``) is broadcast the same way, per position (-1 on padding),
  in both modes;
- per-row fields: numeric scalars as a [num_rows] tensor, anything else as a list (e.g. ``adapter_name``);
- ``row_lengths`` (list[int]), ``num_tokens`` (real tokens), ``packed`` (bool); packed batches also carry
  ``cu_seqlens`` (int32 [num_rows + 1]) and ``max_seqlen``;
- image rows (from a vision template): ``pixel_values`` and ``image_grid_thw`` concatenated over the rows in
  order (so the k-th image's patches meet the k-th run of image tokens), ``image_counts`` (images per row) and
  ``mm_token_type_ids`` [B, T] (long, **not** shifted: 1 on image tokens, 0 on text and padding). Batches
  without images carry none of these.
"""

from __future__ import annotations

from numbers import Number
from typing import Any, Sequence

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.processor.base import InputProcessor
from twinkle_core.types import IGNORE_INDEX, IMAGE_ROW_FIELDS, TOKEN_TYPE_FIELD, as_list

INPUT_FIELDS = ('input_ids', 'labels', 'attention_mask', 'position_ids')
_IMAGE_FIELDS = (*IMAGE_ROW_FIELDS, TOKEN_TYPE_FIELD)


class CausalLMProcessor(InputProcessor):
    """Collate rows by right padding (default) or by packing them into one row (``padding_free=True``).

    `pad_token_id`: the id written on padding (never attended to, never a target). `pad_to_multiple_of`: round
    the padded/packed length up (e.g. 8 for tensor cores). `per_row_index_fields`: integer per-row fields to
    broadcast per position (multi-adapter batches rely on ``adapter_index``).
    """

    def __init__(
        self,
        padding_free: bool = False,
        pad_token_id: int = 0,
        pad_to_multiple_of: int | None = None,
        per_row_index_fields: Sequence[str] = ('adapter_index',),
        padding_side: str = 'right',
    ) -> None:
        if padding_side != 'right':
            raise InvalidInputError(
                f'padding_side={padding_side!r}: training batches are padded on the right (each '
                f"row's positions start at its first token); use padding_side='right' or "
                f'padding_free=True.'
            )
        self.padding_free = padding_free
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.per_row_index_fields = tuple(per_row_index_fields)

    def __call__(self, rows: list[dict[str, Any]], *, device: Any = None) -> dict[str, Any]:
        if not rows:
            raise InvalidInputError('Cannot collate an empty batch: pass at least one row (an InputFeature dict).')
        lengths = [len(r['input_ids']) for r in rows]
        token_fields, row_fields = _classify_fields(rows, lengths, self.per_row_index_fields)
        if self.padding_free:
            batch = self._pack(rows, lengths, token_fields)
        else:
            batch = self._pad(rows, lengths, token_fields)
        batch.update(_row_fields(rows, row_fields))
        batch.update(_image_fields(rows))
        batch.update(row_lengths=lengths, num_tokens=sum(lengths), packed=self.padding_free)
        if device is not None:
            batch = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        return batch

    # ---- layouts -------------------------------------------------------------------------------------------
    def _round(self, n: int) -> int:
        m = self.pad_to_multiple_of
        return n if not m else -(-n // m) * m

    def _pad(self, rows: list[dict[str, Any]], lengths: list[int], token_fields: list[str]) -> dict[str, Any]:
        width = self._round(max(lengths))
        columns = _Columns(self.pad_token_id, token_fields, self.per_row_index_fields)
        for b, (row, n) in enumerate(zip(rows, lengths)):
            columns.add_row(b, row, n)
            columns.pad(width - n)
        out = columns.tensors(shape=(len(rows), width))
        out['attention_mask'] = (out['row_index'] >= 0).long()
        return out

    def _pack(self, rows: list[dict[str, Any]], lengths: list[int], token_fields: list[str]) -> dict[str, Any]:
        total = sum(lengths)
        columns = _Columns(self.pad_token_id, token_fields, self.per_row_index_fields)
        for b, (row, n) in enumerate(zip(rows, lengths)):
            columns.add_row(b, row, n)
        columns.pad(self._round(total) - total)
        out = columns.tensors(shape=(1, self._round(total)))
        out['attention_mask'] = None
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(lengths).cumsum(0)
        out.update(cu_seqlens=cu, max_seqlen=max(lengths))
        return out


class _Columns:
    """Flat python columns, appended row by row (already shifted), turned into tensors once."""

    def __init__(self, pad_token_id: int, token_fields: list[str], index_fields: tuple[str, ...]) -> None:
        self.pad_token_id = pad_token_id
        self.token_fields = token_fields
        self.index_fields = index_fields
        self.present_index_fields: set[str] = set()
        self.cols: dict[str, list[Any]] = {
            k: []
            for k in (
                'input_ids',
                'position_ids',
                'labels',
                'target_ids',
                'row_index',
                TOKEN_TYPE_FIELD,
                *token_fields,
                *index_fields,
            )
        }
        self.has_token_types = False

    def add_row(self, b: int, row: dict[str, Any], n: int) -> None:
        c = self.cols
        ids = as_list(row['input_ids'])
        labels = as_list(row['labels']) if row.get('labels') is not None else [IGNORE_INDEX] * n
        next_labels = labels[1:]
        c['input_ids'] += ids
        c['position_ids'] += as_list(row['position_ids']) if row.get('position_ids') is not None else list(range(n))
        c['labels'] += next_labels + [IGNORE_INDEX]
        c['target_ids'] += [lab if lab != IGNORE_INDEX else tok for lab, tok in zip(next_labels, ids[1:])]
        c['target_ids'].append(IGNORE_INDEX)
        c['row_index'] += [b] * n
        types = row.get(TOKEN_TYPE_FIELD)
        self.has_token_types |= types is not None
        c[TOKEN_TYPE_FIELD] += as_list(types) if types is not None else [0] * n
        for name in self.token_fields:
            values = row.get(name)
            c[name] += (as_list(values)[1:] + [0]) if values is not None else [0] * n
        for name in self.index_fields:
            value = row.get(name)
            if value is not None:
                self.present_index_fields.add(name)
            c[name] += [int(value) if value is not None else -1] * n

    def pad(self, n: int) -> None:
        if n <= 0:
            return
        c = self.cols
        c['input_ids'] += [self.pad_token_id] * n
        c['position_ids'] += list(range(n))  # a separate (ignored) segment: never attended to by real tokens
        for name in ('labels', 'target_ids'):
            c[name] += [IGNORE_INDEX] * n
        for name in ('row_index', *self.index_fields):
            c[name] += [-1] * n
        for name in (TOKEN_TYPE_FIELD, *self.token_fields):
            c[name] += [0] * n

    def tensors(self, shape: tuple[int, int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, values in self.cols.items():
            if name in self.index_fields and name not in self.present_index_fields:
                continue
            if name == TOKEN_TYPE_FIELD and not self.has_token_types:
                continue
            dtype = torch.float32 if name in self.token_fields else torch.long
            out[name] = torch.tensor(values, dtype=dtype).view(shape)
        return out


def _is_numeric_sequence(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 1 and not value.is_complex()
    if hasattr(value, 'tolist') and hasattr(value, 'ndim'):  # numpy arrays
        return value.ndim == 1
    return isinstance(value, (list, tuple)) and all(isinstance(v, Number) for v in value)


def _classify_fields(
    rows: list[dict[str, Any]], lengths: list[int], index_fields: tuple[str, ...]
) -> tuple[list[str], list[str]]:
    """Split the extra fields into per-token (numeric, as long as input_ids in every row that has them) and
    per-row fields. A field that is per-token in one row but not in another is an error naming the row."""
    token_fields: dict[str, int] = {}
    row_fields: dict[str, None] = {}
    for i, (row, n) in enumerate(zip(rows, lengths)):
        mask = row.get('attention_mask')
        if mask is not None and not all(int(m) == 1 for m in as_list(mask)):
            raise InvalidInputError(
                f'Batch row {i} has padding inside (attention_mask contains 0); pass unpadded '
                f'rows: the processor pads or packs them.'
            )
        for name, value in row.items():
            if name in INPUT_FIELDS or name in index_fields or name in _IMAGE_FIELDS or value is None:
                continue
            per_token = _is_numeric_sequence(value) and len(value) == n
            if name in token_fields and not per_token:
                raise InvalidInputError(
                    f'Batch row {i}: per-token field {name!r} has {len(value) if hasattr(value, "__len__") else 1} '
                    f'values but the row has {n} tokens (row {token_fields[name]} had one per token).'
                )
            if per_token:
                if name in row_fields:
                    raise InvalidInputError(
                        f'Batch row {i}: field {name!r} is per-token here but per-row in an '
                        f'earlier row; give it one value per token in every row.'
                    )
                token_fields.setdefault(name, i)
            else:
                row_fields.setdefault(name)
    return list(token_fields), list(row_fields)


def _image_fields(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``pixel_values`` / ``image_grid_thw`` of every image row, concatenated in row order, and ``image_counts``."""
    grids = [
        torch.as_tensor(r['image_grid_thw'], dtype=torch.long).view(-1, 3)
        if r.get('image_grid_thw') is not None
        else torch.zeros(0, 3, dtype=torch.long)
        for r in rows
    ]
    if not any(len(g) for g in grids):
        return {}
    pixels = []
    for i, (row, grid) in enumerate(zip(rows, grids)):
        if not len(grid):
            continue
        values = torch.as_tensor(row.get('pixel_values'), dtype=torch.float32)
        if values.dim() != 2 or values.shape[0] != int(grid.prod(-1).sum()):
            raise InvalidInputError(
                f'Batch row {i}: pixel_values has shape {tuple(values.shape)} but its '
                f'image_grid_thw {grid.tolist()} needs {int(grid.prod(-1).sum())} patch rows.'
            )
        pixels.append(values)
    return {
        'pixel_values': torch.cat(pixels),
        'image_grid_thw': torch.cat(grids),
        'image_counts': [len(g) for g in grids],
    }


def _row_fields(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Per-row fields: all-numeric (and present in every row) -> a [num_rows] tensor; else a list."""
    out: dict[str, Any] = {}
    for name in names:
        values = [row.get(name) for row in rows]
        if all(isinstance(v, Number) and not isinstance(v, bool) for v in values):
            dtype = torch.float32 if any(isinstance(v, float) for v in values) else torch.long
            out[name] = torch.tensor(values, dtype=dtype)
        else:
            out[name] = values
    return out
