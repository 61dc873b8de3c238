"""Cross-entropy (negative log-likelihood of the labels), optionally weighted per token.

Reads ``outputs['logps']`` [B, T] (log-prob of ``labels[:, t]``, 0 where masked) and ``outputs['mask']``; the
model computes the log-probs (see the Loss contract in `twinkle_core.loss.base`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import Loss, LossOutput

Reduction = Literal['token_mean', 'sum', 'sequence_mean']
REDUCTIONS: tuple[str, ...] = ('token_mean', 'sum', 'sequence_mean')


class CrossEntropyLoss(Loss):
    """``-sum_t w_t * logp_t`` over loss tokens (``labels != -100``), reduced by `reduction`.

    Weights: the per-token field ``weights`` when the batch has one (any real value, negative included -- e.g.
    Tinker's ``forward_backward_custom`` turns a custom loss into linear weights on log-probs), else 1.

    Reductions (of one micro-batch):
    - ``token_mean`` (default): divide by the number of loss tokens in the micro-batch (not by the sum of
      weights, which may be zero or negative). Gradient accumulation over k micro-batches divides each
      micro-batch's loss by k, so k micro-batches of equal token counts equal one big batch.
    - ``sum``: no division (Tinker semantics: gradients of successive calls add up until the optimizer step;
      the model does not divide by k).
    - ``sequence_mean``: mean over tokens within each row, then mean over the rows that have loss tokens
      (every sequence counts the same, whatever its length). Divided by k under accumulation.
    """

    row_keywords = frozenset()

    def __init__(self, reduction: Reduction = 'token_mean') -> None:
        if reduction not in REDUCTIONS:
            raise InvalidInputError(f'Unknown reduction {reduction!r}; choose one of {", ".join(REDUCTIONS)}.')
        self.reduction = reduction

    def token_losses(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> torch.Tensor:
        """Per-token loss [B, T]: ``-w_t * logp_t`` on loss tokens, 0 elsewhere."""
        logps, mask = outputs['logps'], outputs['mask']
        losses = -logps
        weights = inputs.get('weights')
        if weights is not None:
            losses = losses * weights.to(losses.dtype)
        return torch.where(mask, losses, 0.0)

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        losses = self.token_losses(inputs, outputs)
        mask = outputs['mask']
        num_tokens = int(mask.sum())
        if self.reduction == 'sum':
            loss = losses.sum()
        elif self.reduction == 'token_mean':
            loss = losses.sum() / max(num_tokens, 1)
        else:
            loss = _sequence_mean(losses, mask, inputs['row_index'])
        return LossOutput(loss=loss, num_tokens=num_tokens)


def _sequence_mean(losses: torch.Tensor, mask: torch.Tensor, row_index: torch.Tensor) -> torch.Tensor:
    """Mean over rows (by ``row_index``; -1 = padding) of each row's mean token loss."""
    rows = torch.where(mask, row_index, -1).reshape(-1)
    keep = rows >= 0
    rows, values = rows[keep], losses.reshape(-1)[keep]
    if rows.numel() == 0:
        return losses.sum() * 0.0
    n = int(row_index.max()) + 1
    sums = torch.zeros(n, dtype=values.dtype, device=values.device).index_add(0, rows, values)
    counts = torch.zeros(n, dtype=values.dtype, device=values.device).index_add(0, rows, torch.ones_like(values))
    has = counts > 0
    return (sums[has] / counts[has]).mean()


class ChunkedCrossEntropyLoss(CrossEntropyLoss):
    """`CrossEntropyLoss` whose log-probs the model computes from the final hidden states and the output
    embedding in chunks of `chunk_tokens` tokens, never materialising the [T, V] logits (large vocabularies,
    long sequences). Same values and gradients as `CrossEntropyLoss`. Models fall back to full logits (with a
    warning) when the output layer cannot be used that way (e.g. a LoRA on ``lm_head``)."""

    logps_from_hidden_states = True

    def __init__(self, reduction: Reduction = 'token_mean', chunk_tokens: int = 1024) -> None:
        super().__init__(reduction)
        if chunk_tokens < 1:
            raise InvalidInputError(f'chunk_tokens must be >= 1, got {chunk_tokens}.')
        self.chunk_tokens = chunk_tokens
