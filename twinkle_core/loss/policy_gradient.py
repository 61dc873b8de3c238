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
gspo              ``-sum min(s_t*A, clip(s_t, lo, hi)*A)``       clip_low_threshold 0.9997, clip_high_threshold 1.0004
stable_reinforce  ``-sum m*(sg(clip(r, lo, hi))*lp*A - kl*k3)``  clip_low_threshold 0.0, clip_high_threshold 2.0,
                                                                 kl_coeff 0.0
================  =============================================  ==============================================

``gspo`` (GSPO-token, `GSPOTokenLoss`): ``s_t = sg(s) * exp(lp - sg(lp))`` with the sequence ratio
``s = exp(mean over M of (lp - q))``, ``M`` = the row's positions where ``sequence_ratio_mask != 0`` (default: where
``A != 0``). ``stable_reinforce`` (`StableReinforceLoss`): ``m`` = the action positions (per-token input
``action_mask``, default ``A != 0``), ``k3 = r - 1 - log r`` (the k3 estimator of KL(q || pi)). Both accept the
thresholds also as per-token inputs ``clip_low_threshold`` / ``clip_high_threshold`` (``gspo`` only).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any, ClassVar

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import Loss, LossOutput
from twinkle_core.loss.token_batch import TokenBatch


class _SampledPolicyLoss(Loss):
    """Shared plumbing: read lp, q, A; sum the per-token objective; report the mean ratio."""

    rows_independent = True
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


class GSPOTokenLoss(Loss):
    """Tinker ``gspo`` (GSPO-token, summed): ``-sum_t min(s_t*A_t, clip(s_t, lo, hi)*A_t)``.

    ``s = exp(mean_{t in M} (sg(lp_t) - q_t))`` is the row's sequence-level (length-normalised) importance ratio over
    the positions ``M`` its per-token ``sequence_ratio_mask`` marks (!= 0; default: the positions with a non-zero
    advantage, i.e. the sampled tokens of Tinker RL data); every token carries ``s``'s value with its own
    log-prob's gradient: ``s_t = exp(log s + lp_t - sg(lp_t))``. A row with no position in ``M`` has ``s = 1``.
    ``lo``/``hi``: ``clip_low_threshold``/``clip_high_threshold`` (GSPO paper defaults ``1 - 3e-4``/``1 + 4e-4``),
    or per-token inputs of the same names, which take precedence.
    """

    rows_independent = True
    row_keywords = frozenset({'old_logps', 'advantages'})
    reduction = 'sum'

    def __init__(self, clip_low_threshold: float = 1.0 - 3e-4, clip_high_threshold: float = 1.0 + 4e-4) -> None:
        self.clip_low, self.clip_high = _thresholds(type(self).__name__, clip_low_threshold, clip_high_threshold)

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, type(self).__name__)
        lp, q, adv = batch.logps, batch.token_field('old_logps'), batch.advantages()
        given = batch.token_field('sequence_ratio_mask', required=False)
        in_ratio = ((given != 0) if given is not None else (adv != 0)) & batch.mask
        weight = in_ratio.to(lp.dtype)
        log_s = batch.row_sum((lp.detach() - q) * weight) / batch.row_sum(weight).clamp(min=1)
        ratio = torch.exp(batch.broadcast_rows(log_s) + lp - lp.detach())
        lo, hi = self._token_thresholds(batch)
        clipped = torch.minimum(torch.maximum(ratio, lo), hi)
        loss = batch.token_sum(-torch.minimum(ratio * adv, clipped * adv))
        with torch.no_grad():
            stats = {'ratio_mean': ratio, 'clip_frac': (ratio < lo) | (ratio > hi)}
            values = torch.stack([batch.token_mean(v.to(ratio.dtype)) for v in stats.values()]).tolist()
        return LossOutput(loss=loss, num_tokens=batch.num_tokens, metrics=dict(zip(stats, values)))

    def _token_thresholds(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token [B, T] thresholds: the per-token inputs where given, else the configured constants."""
        out = []
        for name, default in (('clip_low_threshold', self.clip_low), ('clip_high_threshold', self.clip_high)):
            value = batch.token_field(name, required=False)
            out.append(torch.full_like(batch.logps, default) if value is None else value)
        lo, hi = out
        if bool(((lo > hi) & batch.mask).any()):
            raise InvalidInputError(
                f'{type(self).__name__}: clip_low_threshold must be <= clip_high_threshold at every loss position.'
            )
        return lo, hi


class StableReinforceLoss(Loss):
    """Tinker ``stable_reinforce`` as this server implements it: truncated-importance-weight REINFORCE with an
    optional KL penalty to the sampling policy, over the action positions only::

        r = exp(lp - q);  w = sg(clip(r, lo, hi));  k3 = r - 1 - log r   (estimator of KL(q || pi), q's samples)
        loss = sum_t m_t * (-w_t * lp_t * A_t + kl_coeff * k3_t)

    ``m``: the per-token input ``action_mask`` (the server sets it from the datum's provenance: 1 on tokens a
    `SampledProvenanceSpan` covers, 0 on prompt spans; ``q`` is then the sampler's recorded log-prob), else the
    positions with a non-zero advantage. Defaults: ``clip_low_threshold=0``, ``clip_high_threshold=2`` (the weight is
    truncated at 2), ``kl_coeff=0``.
    """

    rows_independent = True
    row_keywords = frozenset({'old_logps', 'advantages'})
    reduction = 'sum'

    def __init__(
        self, kl_coeff: float = 0.0, clip_low_threshold: float = 0.0, clip_high_threshold: float = 2.0
    ) -> None:
        self.clip_low, self.clip_high = _thresholds(type(self).__name__, clip_low_threshold, clip_high_threshold)
        try:
            self.kl_coeff = float(kl_coeff)
        except (TypeError, ValueError):
            self.kl_coeff = math.nan
        if not math.isfinite(self.kl_coeff) or self.kl_coeff < 0:
            raise InvalidInputError(f'{type(self).__name__}: kl_coeff must be a finite number >= 0, got {kl_coeff!r}.')

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, type(self).__name__)
        lp, q, adv = batch.logps, batch.token_field('old_logps'), batch.advantages()
        given = batch.token_field('action_mask', required=False)
        action = ((given != 0) if given is not None else (adv != 0)) & batch.mask
        zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
        log_r = torch.where(action, lp - q, zero)  # 0 off the actions: no overflow from unrelated q there
        ratio = torch.exp(log_r)
        weight = ratio.detach().clamp(self.clip_low, self.clip_high)
        per_token = -weight * lp * adv
        kl = ratio - 1.0 - log_r
        if self.kl_coeff:
            per_token = per_token + self.kl_coeff * kl
        loss = batch.token_sum(torch.where(action, per_token, zero))
        with torch.no_grad():
            act = action.to(lp.dtype)
            n = act.sum().clamp(min=1)
            clipped = ((ratio < self.clip_low) | (ratio > self.clip_high)) & action
            metrics = torch.stack([(ratio * act).sum() / n, clipped.to(lp.dtype).sum() / n, (kl * act).sum() / n])
        names = ('ratio_mean', 'clip_frac', 'kl')
        return LossOutput(loss=loss, num_tokens=batch.num_tokens, metrics=dict(zip(names, metrics.tolist())))


def _thresholds(owner: str, low: Any, high: Any) -> tuple[float, float]:
    """Validated (low, high) clip thresholds: finite numbers, ``0 <= low <= high``."""
    try:
        lo, hi = float(low), float(high)
    except (TypeError, ValueError):
        raise InvalidInputError(
            f'{owner}: clip_low_threshold and clip_high_threshold must be numbers, got {low!r} and {high!r}.'
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo < 0 or lo > hi:
        raise InvalidInputError(
            f'{owner}: need finite thresholds with 0 <= clip_low_threshold <= clip_high_threshold, got {lo} and {hi}.'
        )
    return lo, hi
