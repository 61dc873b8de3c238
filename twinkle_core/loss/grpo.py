"""GRPO-family losses: GRPO (with the DAPO asymmetric clip) and GSPO.

Per token (``lp`` = ``outputs['logps']``, ``old`` = ``old_logps``, ``ref`` = ``ref_logps``, ``A`` = advantages)::

    r    = exp(lp - old)                                       # GSPO: see GSPOLoss
    pg   = -min(r * A, clip(r, 1 - epsilon, 1 + epsilon_high) * A)
    kl   = exp(ref - lp) - (ref - lp) - 1                      # k3 estimator of KL(pi || ref), only if beta > 0
                                                               # (kl_estimator='k1' | 'k2': twinkle_core.loss.kl)
    loss_token = pg + beta * kl

Aggregation over the micro-batch (``loss_type``):

- ``'grpo'``    -- mean over rows of each row's token mean (``sequence_mean``; the GRPO paper).
- ``'bnpo'``    -- sum over all loss tokens / number of loss tokens (``token_mean``; DAPO's token-level loss).
- ``'dr_grpo'`` -- sum over all loss tokens / (rows * ``max_completion_length``) (Dr. GRPO: no length bias).
  ``max_completion_length`` defaults to the longest row's number of loss tokens in the micro-batch.

Rows without loss tokens are left out of the ``'grpo'`` mean. ``old_logps`` is optional: without it the batch is
taken as on-policy (``old = sg(lp)``, so ``r == 1`` and the gradient is ``-A * grad lp``).

Off-policy data (asynchronous RL, docs/async_rl.md): with ``tis_cap`` set, ``old_logps`` are the BEHAVIOUR
log-probs (the sampler's, possibly of an older policy) and the objective is decoupled PPO with a truncated
importance weight::

    prox = prox_logps if given, else sg(lp)      # the proximal policy: this step's weights
    w    = min(exp(prox - old), tis_cap)          # truncated IS weight of the behaviour policy (no gradient)
    pg   = -w * min(r * A, clip(r, 1 - epsilon, 1 + epsilon_high) * A),   r = exp(lp - prox)

With one update per batch (``prox = sg(lp)``) this is REINFORCE with the truncated IS weight; metrics add
``is_weight_mean`` and ``is_truncated_frac``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import Loss, LossOutput
from twinkle_core.loss.kl import check_estimator, kl_estimate
from twinkle_core.loss.token_batch import TokenBatch

GRPOLossType = Literal['grpo', 'bnpo', 'dr_grpo']
_REDUCTIONS: dict[str, str] = {'grpo': 'sequence_mean', 'bnpo': 'token_mean', 'dr_grpo': 'sequence_mean'}


class GRPOLoss(Loss):
    """Clipped-ratio policy gradient with an optional k3 KL penalty to a reference model.

    Inputs: per-token ``advantages`` [B, T] or per-row ``advantage``; optional ``old_logps`` [B, T] (behaviour
    log-probs); ``ref_logps`` [B, T] when ``beta > 0``. ``epsilon_high=None`` means symmetric clipping.
    """

    rows_independent = True
    row_keywords = frozenset({'old_logps', 'advantages'})

    def __init__(
        self,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        loss_type: GRPOLossType = 'grpo',
        max_completion_length: int | None = None,
        tis_cap: float | None = None,
        kl_estimator: str = 'k3',
    ) -> None:
        check_estimator(type(self).__name__, kl_estimator)
        if tis_cap is not None and not tis_cap > 0:
            raise InvalidInputError(f'{type(self).__name__}: tis_cap must be > 0 (or None), got {tis_cap}.')
        if loss_type not in _REDUCTIONS:
            raise InvalidInputError(
                f'{type(self).__name__}: unknown loss_type {loss_type!r}; choose one of {sorted(_REDUCTIONS)}.'
            )
        if epsilon < 0 or (epsilon_high is not None and epsilon_high < 0) or beta < 0:
            raise InvalidInputError(
                f'{type(self).__name__}: epsilon, epsilon_high and beta must be >= 0 '
                f'(got {epsilon}, {epsilon_high}, {beta}).'
            )
        if max_completion_length is not None and max_completion_length < 1:
            raise InvalidInputError(f'{type(self).__name__}: max_completion_length must be >= 1.')
        self.epsilon_low = float(epsilon)
        self.epsilon_high = float(epsilon if epsilon_high is None else epsilon_high)
        self.beta = float(beta)
        self.loss_type = loss_type
        self.max_completion_length = max_completion_length
        self.reduction = _REDUCTIONS[loss_type]
        self.tis_cap = None if tis_cap is None else float(tis_cap)
        self.kl_estimator = kl_estimator

    def log_ratio(self, batch: TokenBatch, lp: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """Per-token log importance ratio log(pi / pi_old) [B, T]."""
        return lp - old

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, type(self).__name__)
        lp, adv = batch.logps, batch.advantages()
        old = batch.token_field('old_logps', required=self.tis_cap is not None)
        weight = None
        if self.tis_cap is not None and old is not None:  # old = behaviour; the ratio is to the proximal policy
            prox = batch.token_field('prox_logps', required=False)
            prox = lp.detach() if prox is None else prox
            zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
            weight = torch.exp(torch.where(batch.mask, prox - old, zero)).clamp(max=self.tis_cap)
            old = prox
        ratio = torch.exp(self.log_ratio(batch, lp, lp.detach() if old is None else old))
        clipped = ratio.clamp(1.0 - self.epsilon_low, 1.0 + self.epsilon_high)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
        if weight is not None:
            per_token = weight * per_token
        kl = None
        if self.beta > 0:
            kl = kl_estimate(lp, batch.token_field('ref_logps'), self.kl_estimator)
            per_token = per_token + self.beta * kl
        loss = self._aggregate(batch, per_token)
        return LossOutput(loss=loss, num_tokens=batch.num_tokens, metrics=self._metrics(batch, ratio, adv, kl, weight))

    def _aggregate(self, batch: TokenBatch, per_token: torch.Tensor) -> torch.Tensor:
        if self.loss_type == 'grpo':
            return batch.sequence_mean(per_token)
        if self.loss_type == 'bnpo':
            return batch.token_mean(per_token)
        length = self.max_completion_length or max(int(batch.row_tokens().max()) if batch.num_rows else 1, 1)
        return batch.token_sum(per_token) / (max(batch.num_rows, 1) * length)

    @torch.no_grad()
    def _metrics(
        self,
        batch: TokenBatch,
        ratio: torch.Tensor,
        adv: torch.Tensor,
        kl: torch.Tensor | None,
        weight: torch.Tensor | None = None,
    ) -> dict[str, float]:
        low = (ratio < 1.0 - self.epsilon_low) & (adv < 0)
        high = (ratio > 1.0 + self.epsilon_high) & (adv > 0)
        per_token = {'clip_frac': low | high, 'clip_frac_low': low, 'clip_frac_high': high, 'ratio_mean': ratio}
        if kl is not None:
            per_token['kl'] = kl
        if weight is not None:
            per_token['is_weight_mean'] = weight
            per_token['is_truncated_frac'] = weight >= (self.tis_cap or 0.0)
        values = torch.stack([batch.token_mean(v.to(ratio.dtype)) for v in per_token.values()]).tolist()
        return dict(zip(per_token, values))  # one host sync for all of them


class GSPOLoss(GRPOLoss):
    """GSPO: the GRPO objective with one importance ratio per sequence, the geometric mean of its token ratios.

    ``s_i = exp(mean_t (lp - old))`` over row i's loss tokens; each token uses ``sg(s_i) * exp(lp - sg(lp))``
    (value ``s_i``; the GSPO-token form), so with a per-row advantage and ``loss_type='grpo'`` the loss and its
    gradient equal the sequence-level GSPO objective ``-mean_i min(s_i A_i, clip(s_i) A_i)``. Clip ranges are
    much smaller than GRPO's (paper defaults 3e-4 / 4e-4).
    """

    def __init__(
        self,
        epsilon: float = 3e-4,
        epsilon_high: float | None = 4e-4,
        beta: float = 0.0,
        loss_type: GRPOLossType = 'grpo',
        max_completion_length: int | None = None,
        tis_cap: float | None = None,
    ) -> None:
        super().__init__(epsilon, epsilon_high, beta, loss_type, max_completion_length, tis_cap)

    def log_ratio(self, batch: TokenBatch, lp: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        sequence = batch.broadcast_rows(batch.row_mean(lp - old))
        return sequence.detach() + lp - lp.detach()
