"""Backend-neutral pieces of a training step: run a loss and check what it returned, summarise a micro-batch for
the metrics, and turn per-token target log-probs back into per-row lists. A backend computes the forward
outputs (``logps``, ``mask``, ``correct``, ...); these helpers are the same for every backend."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from twinkle_core.errors import TwinkleError
from twinkle_core.loss.base import Loss, LossOutput
from twinkle_core.types import IGNORE_INDEX


def run_loss(loss: Loss, batch: dict[str, Any], outputs: dict[str, Any]) -> LossOutput:
    """Call `loss(batch, outputs)` and check the result: a dict with a scalar tensor ``loss``.

    Raises `TwinkleError` naming the loss when it returns something else.
    """
    result = loss(batch, outputs)
    if isinstance(result, Tensor):
        result = LossOutput(loss=result)
    value = result.get('loss') if isinstance(result, dict) else None
    if not isinstance(value, Tensor) or value.numel() != 1:
        name = getattr(loss, '__name__', type(loss).__name__)
        raise TwinkleError(
            f'Loss {name} must return a scalar tensor or a dict with a scalar tensor "loss"; '
            f'got {type(value if isinstance(result, dict) else result).__name__}.'
        )
    if value.dim() != 0:
        result['loss'] = value.reshape(())
    return result


def step_summary(batch: dict[str, Any], outputs: dict[str, Any], loss: Tensor) -> dict[str, Any]:
    """The micro-batch summary `TrainState.record` folds (``loss``, ``num_loss_tokens``, ``num_correct``,
    ``num_tokens``) as Python numbers, fetched from the device in one transfer."""
    return summary_from_values(batch, summary_values(outputs, loss).tolist())


def summary_values(outputs: dict[str, Any], loss: Tensor) -> Tensor:
    """The summary's device-side numbers ``[loss, num_loss_tokens, num_correct]`` (no host sync): fetch them
    later, e.g. once the backward is queued, and pass them to `summary_from_values`."""
    return torch.stack([loss.detach().float(), outputs['mask'].sum().float(), outputs['correct'].sum().float()])


def summary_from_values(batch: dict[str, Any], values: list[float]) -> dict[str, Any]:
    """`step_summary` from the fetched `summary_values`."""
    return {
        'loss': values[0],
        'num_loss_tokens': int(values[1]),
        'num_correct': int(values[2]),
        'num_tokens': int(batch['num_tokens']),
    }


def rows_logprobs(batch: dict[str, Any], target_logps: Tensor) -> list[list[float]]:
    """Per-row log-probs aligned with each row's ``input_ids``: element i = log p(input_ids[i] | input_ids[:i]),
    element 0 = 0.0. Works for padded ([B, T]) and packed ([1, T] + ``row_lengths``) batches."""
    flat = target_logps.detach().float().cpu()
    lengths: list[int] = batch['row_lengths']
    if batch.get('packed'):
        values = flat.reshape(-1).tolist()
        out, start = [], 0
        for n in lengths:
            out.append([0.0] + values[start : start + n - 1])
            start += n
        return out
    rows = flat.tolist()
    return [[0.0] + rows[b][: n - 1] for b, n in enumerate(lengths)]


def loss_weight(reduction: str | None, *, num_loss_tokens: int, num_rows: int) -> float:
    """What a (rank's or micro-batch's) mean loss is a mean over: tokens (``token_mean``, the default), rows
    (``sequence_mean``), or nothing (``sum``: 1)."""
    if reduction == 'sum':
        return 1.0
    return float(num_rows if reduction == 'sequence_mean' else num_loss_tokens)


def micro_batch_shares(reduction: str | None, batches: list[dict[str, Any]]) -> tuple[list[float], float]:
    """(each collated micro-batch's share of the call's loss, the call's total `loss_weight`): 1 each for
    ``sum``, else its part of the loss tokens (rows). Backpropagating ``share * loss`` per micro-batch gives the
    gradients of one pass over all rows."""
    weights = [
        loss_weight(reduction, num_loss_tokens=int((b['labels'] != IGNORE_INDEX).sum()), num_rows=len(b['row_lengths']))
        for b in batches
    ]
    if reduction == 'sum':
        return [1.0] * len(batches), 1.0
    total = sum(weights)
    return [w / (total or 1.0) for w in weights], total
