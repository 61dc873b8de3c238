"""Tinker `Datum` -> twinkle `InputFeature` rows (the accepted loss names are in `tinker.losses`).

A Datum's input position i predicts `target_tokens[i]`; an InputFeature's `labels` are aligned with
`input_ids` (docs/conventions.md), so: `input_ids = tokens + [target_tokens[-1]]`, `labels = [-100] + target_tokens`
and every per-token tensor `x` becomes `[0] + x`. Same logits, same targets: exact.

Images (`tinker.images`): each image chunk becomes N image tokens and occupies N Tinker positions, so the mapping
stays one to one. Predicting an image token never carries loss: wherever `input_ids[j]` is an image token,
`labels[j]` is -100 and the per-token fields are 0 (the cookbook sends target 0 / weight 0 there anyway). The
row also carries the images' `pixel_values`, `image_grid_thw` and `mm_token_type_ids`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from twinkle_core.types import IGNORE_INDEX, TOKEN_TYPE_FIELD
from twinkle_server.errors import unprocessable
from twinkle_server.tinker.images import ImageEncoder, ImagePolicy, ModelTokens
from twinkle_server.tinker.losses import tinker_loss
from twinkle_server.tinker.stability import ACTION_MASK
from twinkle_server.tinker.wire import WireDatum, check_lengths

#: Tinker loss_fn_inputs name -> InputFeature per-token field (the last three are gspo's optional inputs; the
#: action mask is set by the server from stable_reinforce provenance, `tinker.stability`)
FIELD_NAMES = {
    'weights': 'weights',
    'logprobs': 'old_logps',
    'advantages': 'advantages',
    'sequence_ratio_mask': 'sequence_ratio_mask',
    'clip_low_threshold': 'clip_low_threshold',
    'clip_high_threshold': 'clip_high_threshold',
    ACTION_MASK: 'action_mask',
}
#: optional per-token inputs: a request gives each to every datum or to none (rows of one pass must agree)
ALL_OR_NONE = ('sequence_ratio_mask', 'clip_low_threshold', 'clip_high_threshold', ACTION_MASK)


def to_rows(
    data: list[WireDatum], loss_fn: str, encoder: ImageEncoder, policy: ImagePolicy | None = None
) -> list[dict[str, Any]]:
    """One row per datum; `encoder` (the served model's) expands image chunks within `policy` and refuses bad
    ones (4xx)."""
    required = tinker_loss(loss_fn).inputs
    for name in ALL_OR_NONE:
        having = [name in d.inputs for d in data]
        if any(having) and not all(having):
            raise unprocessable(
                f'datum {having.index(not having[0])}: loss_fn_inputs[{name!r}] is given for some datums of this '
                f'request but not for others; give it to every datum or to none'
            )
    rows = []
    for i, d in enumerate(data):
        missing = [k for k in required if k not in d.inputs]
        if missing:
            raise unprocessable(
                f'datum {i}: loss_fn {loss_fn!r} needs loss_fn_inputs {list(required)}, missing {missing}'
            )
        model = encoder.expand(d.chunks, f'datum {i}', policy)
        if d.has_images:
            check_lengths(d.inputs, len(model.tokens), f'datum {i}')
        rows.append(_row(model, d.inputs, loss_fn, encoder))
    return rows


def _row(model: ModelTokens, inputs: dict[str, np.ndarray], loss_fn: str, encoder: ImageEncoder) -> dict[str, Any]:
    targets = np.asarray(inputs['target_tokens']).astype(np.int64).reshape(-1).tolist()
    last = targets[-1]
    if last == encoder.placeholder_id():
        last = 0  # an input nothing is predicted from; it must not be a stray image token
    row: dict[str, Any] = {'input_ids': model.tokens + [last], 'labels': [IGNORE_INDEX] + targets}
    for name, field in FIELD_NAMES.items():
        if name in inputs:
            row[field] = [0.0] + np.asarray(inputs[name], dtype=np.float64).reshape(-1).tolist()
    if loss_fn == 'cross_entropy' and 'weights' not in row:
        row['weights'] = [0.0] + [1.0] * len(targets)
    if model.has_images:
        row.update(model.image_fields(trailing_text=1))
        for j, is_image in enumerate(row[TOKEN_TYPE_FIELD]):
            if is_image:
                row['labels'][j] = IGNORE_INDEX
                for field in FIELD_NAMES.values():
                    if field in row:
                        row[field][j] = 0.0
    return row


def datum_logprobs(row_logprobs: list[list[float]]) -> list[list[float]]:
    """Row log-probs (aligned with input_ids, element 0 = 0.0) -> per-datum Tinker log-probs."""
    return [lp[1:] for lp in row_logprobs]
