"""Cross-entropy (negative log-likelihood of the labels), optionally weighted per token.

Reads ``outputs['logps']`` [B, T] (log-prob of ``labels[:, t]``, 0 where masked) and ``outputs['mask']``; the
model computes the log-probs (see the Loss contract in `twinkle_core.loss.base`). With ``candidates=True`` (soft /
top-k targets, Tinker's ``(N, K)`` ``target_tokens`` and ``weights``) it reads the full ``outputs['logits']`` and
the candidate matrices ``target_tokens`` / ``weights`` (`twinkle_core.loss.candidates`) instead.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

import twinkle_core.loss.candidates as cand
from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import REDUCTIONS, Loss, LossOutput

Reduction = Literal['token_mean', 'sum', 'sequence_mean']


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

    ``candidates=True``: soft targets, ``-sum_k w[t, k] * logp(target[t, k])`` per token, from the candidate
    matrices ``target_tokens`` and ``weights`` [n, K] of each row (`twinkle_core.loss.candidates`; a row's missing
    columns weigh 0). Needs the full logits (``needs_logits``); the candidates' log-probs are returned per row
    under `candidates.ROW_CANDIDATE_LOGPS` in the metrics.
    """

    rows_independent = True
    row_keywords = frozenset()

    def __init__(self, reduction: Reduction = 'token_mean', candidates: bool = False) -> None:
        if reduction not in REDUCTIONS:
            raise InvalidInputError(f'Unknown reduction {reduction!r}; choose one of {", ".join(REDUCTIONS)}.')
        self.reduction = reduction
        self.candidates = bool(candidates)
        if self.candidates:
            self.needs_logits = True

    def token_losses(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> torch.Tensor:
        """Per-token loss [B, T]: ``-w_t * logp_t`` on loss tokens, 0 elsewhere."""
        if self.candidates:
            return self._candidate_losses(inputs, outputs)[0]
        logps, mask = outputs['logps'], outputs['mask']
        losses = -logps
        weights = inputs.get('weights')
        if weights is not None:
            losses = losses * weights.to(losses.dtype)
        return torch.where(mask, losses, 0.0)

    def _candidate_losses(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-token loss [B, T], candidate log-probs [B, T, K]) of the soft targets."""
        logits, mask = outputs.get('logits'), outputs['mask']
        ids, weights = cand.stack(inputs, 'target_tokens'), cand.stack(inputs, 'weights')
        if logits is None or ids is None or weights is None:
            raise InvalidInputError(
                "CrossEntropyLoss(candidates=True) needs outputs['logits'] and the candidate matrices "
                "'target_tokens' and 'weights' (twinkle_core.loss.candidates); "
                f'got logits={logits is not None}, fields {sorted(inputs)}.'
            )
        if weights.shape != ids.shape:
            raise InvalidInputError(
                f'CrossEntropyLoss: candidate weights have shape {tuple(weights.shape)} but target_tokens '
                f'{tuple(ids.shape)}; give one weight per candidate token.'
            )
        logps = cand.candidate_logps(logits, ids, mask)
        losses = -(logps * weights.to(device=logps.device, dtype=logps.dtype)).sum(-1)
        return torch.where(mask, losses, 0.0), logps

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        metrics: dict[str, Any] = {}
        if self.candidates:
            losses, logps = self._candidate_losses(inputs, outputs)
            metrics[cand.ROW_CANDIDATE_LOGPS] = cand.per_row(inputs, logps, cand.widths(inputs, 'target_tokens'))
        else:
            losses = self.token_losses(inputs, outputs)
        mask = outputs['mask']
        num_tokens = int(mask.sum())
        if self.reduction == 'sum':
            loss = losses.sum()
        elif self.reduction == 'token_mean':
            loss = losses.sum() / max(num_tokens, 1)
        else:
            loss = _sequence_mean(losses, mask, inputs['row_index'])
        if metrics:
            return LossOutput(loss=loss, num_tokens=num_tokens, metrics=metrics)
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
