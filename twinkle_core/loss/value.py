"""`PPOValueLoss`: the critic's clipped regression onto the returns (PPO with a value model).

Per loss position ``t`` (the state before the label at ``t``, as for every per-token field)::

    V_clip_t = old_values_t + clamp(values_t - old_values_t, -clip_range, clip_range)
    loss_t   = 0.5 * max((values_t - returns_t) ** 2, (V_clip_t - returns_t) ** 2)

reduced as ``reduction`` says (token mean by default) -- TRL's ``PPOTrainer`` (``vf_loss``) and OpenRLHF's
``ValueLoss``. ``clip_range=None`` is the plain squared error (no ``old_values`` needed). The critic is a
``TransformersValueModel``; ``values`` come from its head, ``returns`` and ``old_values`` are per-token fields of the
rows (``GAEAdvantage(...).returns`` and the critic's values when the rollout was scored).
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import REDUCTIONS, Loss, LossOutput
from twinkle_core.loss.token_batch import TokenBatch


class PPOValueLoss(Loss):
    """Clipped value loss of a critic (kind ``loss``, name ``PPOValueLoss``).

    Args:
        clip_range: how far ``values`` may move from ``old_values`` before the clipped term takes over (TRL's
            ``cliprange_value``, default 0.2); None: no clipping.
        reduction: ``'token_mean'`` (TRL, OpenRLHF), ``'sequence_mean'`` or ``'sum'``.

    Metrics: ``value_loss``, ``value_clipfrac`` (share of positions where the clipped term was larger),
    ``values_mean``, ``returns_mean`` and ``explained_variance`` = 1 - Var(returns - values) / Var(returns) over
    the batch's loss positions (1: perfect, 0: no better than the mean return).
    """

    needs_values = True
    row_keywords = frozenset()

    def __init__(self, clip_range: float | None = 0.2, reduction: str = 'token_mean') -> None:
        if clip_range is not None and not clip_range > 0:
            raise InvalidInputError(f'PPOValueLoss: clip_range must be > 0 or None, got {clip_range}.')
        if reduction not in REDUCTIONS:
            raise InvalidInputError(f'PPOValueLoss: unknown reduction {reduction!r}; choose one of {REDUCTIONS}.')
        self.clip_range, self.reduction = clip_range, reduction

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, 'PPOValueLoss', reads='values')
        values, returns = batch.output, batch.token_field('returns')
        losses = (values - returns) ** 2
        clipped_more = torch.zeros_like(batch.mask)
        if self.clip_range is not None:
            old = batch.token_field('old_values')
            clipped = old + (values - old).clamp(-self.clip_range, self.clip_range)
            clipped_losses = (clipped - returns) ** 2
            clipped_more = clipped_losses > losses
            losses = torch.maximum(losses, clipped_losses)
        losses = 0.5 * losses
        reduce = {'token_mean': batch.token_mean, 'sequence_mean': batch.sequence_mean, 'sum': batch.token_sum}
        loss = reduce[self.reduction](losses)
        return LossOutput(
            loss=loss, num_tokens=batch.num_tokens, metrics=_value_metrics(batch, values, returns, loss, clipped_more)
        )


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the given (flat) positions; nan when Var(returns) is 0."""
    var = returns.var(unbiased=False)
    return float('nan') if float(var) == 0 else float(1 - (returns - values).var(unbiased=False) / var)


def _value_metrics(
    batch: TokenBatch, values: torch.Tensor, returns: torch.Tensor, loss: torch.Tensor, clipped: torch.Tensor
) -> dict[str, float]:
    with torch.no_grad():
        v, r = values[batch.mask].double(), returns[batch.mask].double()
        n = max(batch.num_tokens, 1)
        return {
            'value_loss': float(loss),
            'value_clipfrac': float((clipped & batch.mask).sum()) / n,
            'values_mean': float(v.mean()) if v.numel() else 0.0,
            'returns_mean': float(r.mean()) if r.numel() else 0.0,
            'explained_variance': explained_variance(v, r) if v.numel() else float('nan'),
        }
