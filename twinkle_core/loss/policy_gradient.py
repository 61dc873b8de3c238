"""Tinker's policy-gradient losses, with exactly Tinker's formulas (docs/tinker_api.md, "Losses").

Each is a SUM over loss tokens (reduction ``'sum'``: gradients add up over micro-batches until the optimizer
step). Notation: ``lp`` = learner log-prob of the label (``outputs['logps']``), ``q`` = behaviour (sampler)
log-prob (per-token input ``old_logps``; Tinker calls it ``logprobs``), ``A`` = advantages (per-token
``advantages`` or per-row ``advantage``), ``r = exp(lp - q)``, ``sg`` = stop-gradient.

================  =============================================  ==============================================
name              loss                                           config (defaults)
================  =============================================  ==============================================
importance_samp.  ``-sum r*A``                                   --
ppo               ``-sum min(r*A, clip(r, lo, hi)*A)``           clip_low_threshold 0.8, clip_high_threshold 1.2
cispo             ``-sum sg(clip(r, lo, hi)) * lp * A``          clip_low_threshold 0.0, clip_high_threshold 4.0
dro               ``-sum (lp*A - beta/2 * (lp - q)^2)``          beta 0.05
================  =============================================  ==============================================
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import Loss, LossOutput
from twinkle_core.loss.token_batch import TokenBatch


class _SampledPolicyLoss(Loss):
    """Shared plumbing: read lp, q, A; sum the per-token objective; report the mean ratio."""

    row_keywords = frozenset({'old_logps', 'advantages'})
    reduction = 'sum'

    @abstractmethod
    def per_token(self, lp: torch.Tensor, q: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        """The loss of every token [B, T] (masked positions are dropped by the caller)."""

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, type(self).__name__)
        lp, q, adv = batch.logps, batch.token_field('old_logps'), batch.advantages()
        loss = batch.token_sum(self.per_token(lp, q, adv))
        with torch.no_grad():
            ratio = torch.exp(lp - q)
            per_token = {'ratio_mean': ratio, **self.extra_metrics(ratio)}
            values = torch.stack([batch.token_mean(v.to(ratio.dtype)) for v in per_token.values()]).tolist()
        return LossOutput(loss=loss, num_tokens=batch.num_tokens, metrics=dict(zip(per_token, values)))

    def extra_metrics(self, ratio: torch.Tensor) -> dict[str, torch.Tensor]:
        """Further per-token statistics to report as token means (name -> [B, T] tensor)."""
        return {}


class _ClippedRatioLoss(_SampledPolicyLoss):
    default_clip: ClassVar[tuple[float, float]] = (0.0, float('inf'))

    def __init__(self, clip_low_threshold: float | None = None, clip_high_threshold: float | None = None) -> None:
        low, high = self.default_clip
        self.clip_low = float(low if clip_low_threshold is None else clip_low_threshold)
        self.clip_high = float(high if clip_high_threshold is None else clip_high_threshold)
        if not self.clip_low <= self.clip_high:
            raise InvalidInputError(
                f'{type(self).__name__}: clip_low_threshold ({self.clip_low}) must be <= '
                f'clip_high_threshold ({self.clip_high}).'
            )

    def extra_metrics(self, ratio: torch.Tensor) -> dict[str, torch.Tensor]:
        return {'clip_frac': (ratio < self.clip_low) | (ratio > self.clip_high)}


class ImportanceSamplingLoss(_SampledPolicyLoss):
    """Tinker ``importance_sampling``: ``-sum exp(lp - q) * A`` (REINFORCE with an importance weight)."""

    def per_token(self, lp: torch.Tensor, q: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        return -torch.exp(lp - q) * adv


class PPOClipLoss(_ClippedRatioLoss):
    """Tinker ``ppo``: ``-sum min(r*A, clip(r, lo, hi)*A)``, lo/hi = clip_low/high_threshold (0.8 / 1.2)."""

    default_clip = (0.8, 1.2)

    def per_token(self, lp: torch.Tensor, q: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        ratio = torch.exp(lp - q)
        return -torch.minimum(ratio * adv, ratio.clamp(self.clip_low, self.clip_high) * adv)


class CISPOLoss(_ClippedRatioLoss):
    """Tinker ``cispo``: ``-sum sg(clip(r, lo, hi)) * lp * A`` (clipped IS weight, REINFORCE gradient; 0.0 / 4.0)."""

    default_clip = (0.0, 4.0)

    def per_token(self, lp: torch.Tensor, q: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        weight = torch.exp(lp - q).clamp(self.clip_low, self.clip_high).detach()
        return -weight * lp * adv


class DROLoss(_SampledPolicyLoss):
    """Tinker ``dro``: ``-sum (lp*A - beta/2 * (lp - q)^2)`` (quadratic penalty instead of a ratio clip)."""

    def __init__(self, beta: float = 0.05) -> None:
        if beta < 0:
            raise InvalidInputError(f'DROLoss: beta must be >= 0, got {beta}.')
        self.beta = float(beta)

    def per_token(self, lp: torch.Tensor, q: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        return -(lp * adv - 0.5 * self.beta * (lp - q) ** 2)
