"""Tinker `Datum` -> twinkle `InputFeature` rows (the accepted loss names are in `api.tinker.losses`).

A Datum's input position i predicts `target_tokens[i]`; an InputFeature's `labels` are aligned with
`input_ids` (docs/conventions.md), so: `input_ids = tokens + [target_tokens[-1]]`, `labels = [-100] + target_tokens`
and every per-token tensor `x` becomes `[0] + x`. Same logits, same targets: exact.

Images (`service.images`): each image chunk becomes N image tokens and occupies N Tinker positions, so the mapping
stays one to one. Predicting an image token never carries loss: wherever `input_ids[j]` is an image token,
`labels[j]` is -100 and the per-token fields are 0 (the cookbook sends target 0 / weight 0 there anyway). The
row also carries the images' `pixel_values`, `image_grid_thw` and `mm_token_type_ids`.

Soft targets (`recipes.sdft`): `cross_entropy` with ``(N, K)`` `target_tokens` and `weights` (same shape) scores
K candidates per position, ``-sum_k w[t, k] * logp(target[t, k])``. Both travel as candidate matrices
(`twinkle_core.loss.candidates`; a 1-D datum of the same request as K = 1) and the loss is
`CrossEntropyLoss(candidates=True)`; `labels` hold the first candidate. Custom losses (`engine.custom_loss.program`) get
their declared inputs as fields `custom:<name>` (rank 0 a per-row number, rank 1 per-token, rank 2 a matrix) and,
for rank-2 `logprobs`, the `target_tokens` matrix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import twinkle_core.loss.candidates as cand
from twinkle_core.types import IGNORE_INDEX, TOKEN_TYPE_FIELD
from twinkle_server.api.tinker.losses import tinker_loss
from twinkle_server.api.tinker.stability import ACTION_MASK
from twinkle_server.api.tinker.wire import WireDatum, check_lengths
from twinkle_server.engine.custom_loss.program import CustomLossSpec, input_field
from twinkle_server.errors import unprocessable
from twinkle_server.service.images import ImageEncoder, ImagePolicy, ModelTokens

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
#: the widest candidate matrix (K of 2-D `target_tokens` or of a rank-2 custom input) a datum may carry
MAX_CANDIDATES = 128


def to_rows(
    data: list[WireDatum],
    loss_fn: str,
    encoder: ImageEncoder,
    policy: ImagePolicy | None = None,
    custom: CustomLossSpec | None = None,
) -> list[dict[str, Any]]:
    """One row per datum; `encoder` (the served model's) expands image chunks within `policy` and refuses bad
    ones (4xx). `custom`: the loss of a `custom` request (its declared inputs are required, at their ranks)."""
    required = tinker_loss(loss_fn).inputs + tuple(i.name for i in (custom.inputs[1:] if custom else ()))
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
        _check_shapes(d.inputs, loss_fn, custom, f'datum {i}')
    candidates = loss_fn == 'cross_entropy' and has_candidates(data)
    for i, d in enumerate(data):
        model = encoder.expand(d.chunks, f'datum {i}', policy)
        if d.has_images:
            check_lengths(d.inputs, len(model.tokens), f'datum {i}')
        rows.append(_row(model, d.inputs, loss_fn, encoder, candidates, custom))
    return rows


def has_candidates(data: list[WireDatum]) -> bool:
    """Whether some datum has 2-D ``(N, K)`` `target_tokens` (soft targets)."""
    return any(d.inputs['target_tokens'].ndim == 2 for d in data if 'target_tokens' in d.inputs)


def _check_shapes(inputs: dict[str, np.ndarray], loss_fn: str, custom: CustomLossSpec | None, where: str) -> None:
    """422 unless every input the loss reads has the rank it takes: 1-D per-token tensors; ``(N, K)`` targets (and
    weights) for `cross_entropy` and `custom`; a custom loss's declared ranks."""
    targets = inputs['target_tokens']
    if targets.ndim not in (1, 2):
        raise unprocessable(f'{where}: target_tokens must be 1-D [N] or 2-D [N, K], got shape {list(targets.shape)}')
    if targets.ndim == 2 and loss_fn not in ('cross_entropy', 'custom'):
        raise unprocessable(f'{where}: loss_fn {loss_fn!r} takes 1-D target_tokens, got shape {list(targets.shape)}')
    _check_matrix('target_tokens', targets, where)
    if targets.size and targets.min() < 0:
        raise unprocessable(f'{where}: target_tokens holds a negative token id ({int(targets.min())})')
    if custom is not None:
        ranks = {'target_tokens': custom.inputs[0].rank, **{i.name: i.rank for i in custom.inputs[1:]}}
    else:
        ranks = {name: targets.ndim if name == 'weights' else 1 for name in FIELD_NAMES if name in inputs}
        ranks['target_tokens'] = targets.ndim
    for name, rank in ranks.items():
        arr = inputs[name]
        if arr.ndim != rank and not (rank == 1 and arr.ndim == 0 and targets.shape[0] == 1):
            raise unprocessable(
                f'{where}: loss_fn_inputs[{name!r}] has shape {list(arr.shape)}; loss_fn {loss_fn!r} takes it with '
                f'rank {rank}' + (' (the rank of target_tokens)' if name in ('weights', 'target_tokens') else '')
            )
        _check_matrix(name, arr, where)
    if loss_fn == 'cross_entropy' and targets.ndim == 2:
        weights = inputs.get('weights')
        if weights is None or weights.shape != targets.shape:
            got = 'none' if weights is None else f'shape {list(weights.shape)}'
            raise unprocessable(
                f'{where}: 2-D target_tokens {list(targets.shape)} need weights of the same shape (one weight per '
                f'candidate token), got {got}'
            )


def _check_matrix(name: str, arr: np.ndarray, where: str) -> None:
    if arr.ndim == 2 and not 1 <= arr.shape[1] <= MAX_CANDIDATES:
        raise unprocessable(
            f'{where}: loss_fn_inputs[{name!r}] has {arr.shape[1]} columns; a 2-D input takes 1 to '
            f'{MAX_CANDIDATES} per position'
        )


def _row(
    model: ModelTokens,
    inputs: dict[str, np.ndarray],
    loss_fn: str,
    encoder: ImageEncoder,
    candidates: bool,
    custom: CustomLossSpec | None,
) -> dict[str, Any]:
    raw = np.asarray(inputs['target_tokens']).astype(np.int64)
    matrix = raw.reshape(len(raw), -1) if raw.ndim == 2 or candidates else None
    targets = (matrix[:, 0] if matrix is not None else raw.reshape(-1)).tolist()
    last = targets[-1]
    if last == encoder.placeholder_id():
        last = 0  # an input nothing is predicted from; it must not be a stray image token
    row: dict[str, Any] = {'input_ids': model.tokens + [last], 'labels': [IGNORE_INDEX] + targets}
    if matrix is not None:
        _add_matrix(row, 'target_tokens', matrix)
    if custom is not None:
        for item in custom.inputs[1:]:
            arr = np.asarray(inputs[item.name], dtype=np.float64)
            if item.rank == 0:
                row[input_field(item.name)] = float(arr.reshape(-1)[0])
            elif item.rank == 1:
                row[input_field(item.name)] = [0.0] + arr.reshape(-1).tolist()
            else:
                _add_matrix(row, input_field(item.name), arr)
    elif candidates:
        weights = inputs.get('weights')
        weights = np.ones(len(targets)) if weights is None else np.asarray(weights, dtype=np.float64)
        _add_matrix(row, 'weights', weights.reshape(len(targets), -1))
    for name, field in FIELD_NAMES.items():
        if name in inputs and custom is None and not (candidates and name == 'weights'):
            row[field] = [0.0] + np.asarray(inputs[name], dtype=np.float64).reshape(-1).tolist()
    if loss_fn == 'cross_entropy' and not candidates and 'weights' not in row:
        row['weights'] = [0.0] + [1.0] * len(targets)
    if model.has_images:
        n = len(targets) + 1
        per_token = [
            k for k, v in row.items() if k not in ('input_ids', 'labels') and isinstance(v, list) and len(v) == n
        ]
        row.update(model.image_fields(trailing_text=1))
        for j, is_image in enumerate(row[TOKEN_TYPE_FIELD]):
            if is_image:
                row['labels'][j] = IGNORE_INDEX
                for field in per_token:
                    row[field][j] = 0.0
    return row


def _is_per_token(value: Any, n: int) -> bool:
    return isinstance(value, list) and len(value) == n


def _add_matrix(row: dict[str, Any], name: str, matrix: np.ndarray) -> None:
    """`matrix` [N, K] as candidate matrix `name` of the row (a zero row first: aligned with input_ids)."""
    cand.add_matrix(row, name, [[0.0] * matrix.shape[1]] + np.asarray(matrix, dtype=np.float64).tolist())


def datum_logprobs(row_logprobs: list[list[float]]) -> list[list[float]]:
    """Row log-probs (aligned with input_ids, element 0 = 0.0) -> per-datum Tinker log-probs."""
    return [lp[1:] for lp in row_logprobs]
