"""The Twinkle documents' per-row keywords of `forward_backward`, folded into the rows the loss reads.

    model.forward_backward(inputs=rows, old_logps=old_logps, advantages=advantages, micro_batch_size=4)

- ``advantages``: one value per row -> the row field ``advantage`` (broadcast over its loss tokens), or one list
  per row -> the per-token field ``advantages``;
- ``old_logps``: one list per row of the behaviour policy's log-probs -> the per-token field ``old_logps`` (0.0
  elsewhere): with one value per labelled position (``labels != -100``) they go to those positions in order (a
  multi-turn episode's sampled turns, separated by inserted tokens); otherwise they are the row's last tokens (a
  sampled completion, as ``[lp[0][1] for lp in sequence.logprobs]`` gives them), left-padded to the row's length;
- ``micro_batch_size``: rows per forward/backward pass inside one call (`micro_batches`); the gradients equal
  one pass over all rows.
A row that already holds the field keeps nothing of its own: giving both is an error.
"""

from __future__ import annotations

from typing import Any, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import IGNORE_INDEX, as_input_features


def with_row_keywords(
    inputs: Any, *, old_logps: Sequence[Any] | None = None, advantages: Sequence[Any] | None = None, loss: Any = None
) -> Any:
    """`inputs` with ``old_logps`` / ``advantages`` folded into its rows (unchanged when both are None). A keyword
    that `loss` declares it does not read (`Loss.row_keywords`) is refused rather than silently unused."""
    if old_logps is None and advantages is None:
        return inputs
    uses = getattr(loss, 'row_keywords', None)
    for name, values in (('old_logps', old_logps), ('advantages', advantages)):
        if values is not None and uses is not None and name not in uses:
            raise InvalidInputError(
                f'{name}= is not read by {type(loss).__name__}; set a loss that reads it (e.g. '
                f'set_loss("GRPOLoss")) or leave it out.'
            )
    if isinstance(inputs, dict) and 'input_ids' not in inputs:
        raise InvalidInputError(
            "old_logps= / advantages= go with one adapter's rows (inputs=[...]); for several "
            "adapters put the fields into each adapter's rows."
        )
    rows = [dict(row) for row in as_input_features(inputs)]
    for name, values in (('old_logps', old_logps), ('advantages', advantages)):
        if values is not None and len(values) != len(rows):
            raise InvalidInputError(f'{name}= has {len(values)} entries for {len(rows)} rows; give one per row.')
    for i, row in enumerate(rows):
        n = len(row['input_ids'])
        if advantages is not None:
            value = advantages[i]
            field = 'advantages' if isinstance(value, (list, tuple)) or bool(getattr(value, 'ndim', 0)) else 'advantage'
            _set(row, field, float(value) if field == 'advantage' else _left_padded(value, n, i, 'advantages'), i)
        if old_logps is not None:
            _set(row, 'old_logps', _at_labels(old_logps[i], row.get('labels'), n, i), i)
    return rows


def check_row_lengths(rows: Sequence[Any], max_length: int | None, source: str) -> None:
    """Raise `InvalidInputError` naming the first row longer than `max_length` (None: no limit) and where the
    limit comes from (`source`)."""
    if max_length is None:
        return
    for i, row in enumerate(rows):
        n = len(row['input_ids'])
        if n > max_length:
            raise InvalidInputError(
                f'Batch row {i} has {n} tokens, more than the limit of {max_length} ({source}). '
                f"Truncate it (e.g. the template's max_length) or drop it."
            )


def micro_batches(rows: list[Any], micro_batch_size: int) -> list[list[Any]]:
    """Consecutive chunks of at most `micro_batch_size` rows."""
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise InvalidInputError(f'micro_batch_size must be an int >= 1, got {micro_batch_size!r}.')
    return [rows[i : i + micro_batch_size] for i in range(0, len(rows), micro_batch_size)]


def _left_padded(values: Any, length: int, row: int, name: str) -> list[float]:
    values = _floats(values)
    if len(values) > length:
        raise InvalidInputError(f'{name}[{row}] has {len(values)} values for a row of {length} tokens.')
    return [0.0] * (length - len(values)) + values


def _at_labels(values: Any, labels: Sequence[int] | None, length: int, row: int) -> list[float]:
    """`values` at the labelled positions of `labels` when there is one value per labelled position, else
    left-padded to `length` (`_left_padded`)."""
    floats = _floats(values)
    positions = [i for i, label in enumerate(labels or ()) if label != IGNORE_INDEX]
    if labels is None or len(labels) != length or len(floats) != len(positions):
        return _left_padded(floats, length, row, 'old_logps')
    out = [0.0] * length
    for position, value in zip(positions, floats):
        out[position] = value
    return out


def _floats(values: Any) -> list[float]:
    tolist = getattr(values, 'tolist', None)
    return [float(v) for v in (tolist() if callable(tolist) else values)]


def _set(row: dict[str, Any], field: str, value: Any, index: int) -> None:
    if row.get(field) is not None:
        raise InvalidInputError(f'row {index} already has {field!r}; pass it either in the row or as a keyword.')
    row[field] = value
