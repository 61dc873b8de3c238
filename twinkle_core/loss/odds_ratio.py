"""Reference-free preference losses with a language-model term: ORPO and CPO.

Batch layout: (chosen, rejected) row pairs (`twinkle_core.loss.pairs`). Per row, ``pi`` is the sum of
``outputs['logps']`` over its loss tokens, ``n`` its number of loss tokens and ``avg = pi / n``. ``nll`` is the
cross-entropy of the chosen rows (-log-prob averaged over all their tokens). No reference model is needed.

==========================  ===========================================================================
loss                        per batch (pair terms averaged over pairs)
==========================  ===========================================================================
``ORPOLoss``                ``log_odds(x) = x - log(1 - exp(x))``;
                            ``nll - beta * mean(logsigmoid(log_odds(avg_c) - log_odds(avg_r)))``
``CPOLoss`` ``'sigmoid'``   ``z = beta * (pi_c - pi_r)``;  ``mean(-(1-ls)*logsigmoid(z) - ls*logsigmoid(-z))
                            + alpha * nll``
``CPOLoss`` ``'hinge'``     ``mean(relu(1 - beta * (pi_c - pi_r))) + alpha * nll``
``CPOLoss`` ``'simpo'``     ``z = beta * (avg_c - avg_r) - simpo_gamma``, then as ``'sigmoid'`` (CPO-SimPO)
==========================  ===========================================================================

These are TRL's definitions (``trl/trainer/orpo_trainer.py`` ``odds_ratio_loss``: ``beta`` is ORPO's lambda;
``trl/trainer/cpo_trainer.py`` ``cpo_loss``, ``cpo_alpha``). Metrics: the implicit rewards ``beta * avg``
(ORPO) or ``beta * pi`` (CPO; ``beta * avg`` for simpo) as ``rewards/chosen``, ``rewards/rejected``, ``margin``,
``accuracy``; ``nll``; ORPO also ``log_odds_ratio``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import Loss, LossOutput
from twinkle_core.loss.pairs import check_options, check_pairs, chosen_nll, reward_metrics
from twinkle_core.loss.token_batch import TokenBatch

CPOLossType = Literal['sigmoid', 'hinge', 'simpo']
CPO_TYPES = ('sigmoid', 'hinge', 'simpo')


def _positive(name: str, value: float) -> float:
    if not value > 0:
        raise InvalidInputError(f'{name} must be > 0, got {value}.')
    return float(value)


class ORPOLoss(Loss):
    """Odds-ratio preference optimisation (Hong et al., 2024): SFT on the chosen rows plus ``beta`` times the
    log-sigmoid of the log odds ratio of chosen over rejected; see the module docstring."""

    row_keywords = frozenset()
    reduction = 'sequence_mean'

    def __init__(self, beta: float = 0.1) -> None:
        self.beta = _positive('ORPOLoss: beta', beta)

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, 'ORPOLoss')
        lengths = check_pairs(batch)
        average = batch.row_sum(batch.logps) / lengths
        # log(1 - exp(x)) for x < 0, stable near 0 (a completion the model is sure of)
        log_odds = average - torch.log(-torch.expm1(average.clamp(max=-1e-7)))
        ratio = log_odds[0::2] - log_odds[1::2]
        nll = chosen_nll(batch)
        loss = nll - self.beta * F.logsigmoid(ratio).mean()
        metrics = reward_metrics(self.beta * average[0::2].detach(), self.beta * average[1::2].detach())
        metrics.update(nll=float(nll.detach()), log_odds_ratio=float(ratio.detach().mean()))
        return LossOutput(loss=loss, num_tokens=batch.num_tokens, metrics=metrics)


class CPOLoss(Loss):
    """Contrastive preference optimisation (Xu et al., 2024): a reference-free DPO-style term plus ``alpha``
    times the chosen rows' language-model loss; see the module docstring."""

    row_keywords = frozenset()
    reduction = 'sequence_mean'

    def __init__(
        self,
        beta: float = 0.1,
        loss_type: CPOLossType = 'sigmoid',
        alpha: float = 1.0,
        label_smoothing: float = 0.0,
        simpo_gamma: float = 0.5,
    ) -> None:
        check_options('CPOLoss', beta=beta, loss_type=loss_type, choices=CPO_TYPES, label_smoothing=label_smoothing)
        if alpha < 0:
            raise InvalidInputError(f"CPOLoss: alpha (the weight of the chosen rows' NLL) must be >= 0, got {alpha}.")
        self.beta, self.loss_type = float(beta), loss_type
        self.alpha, self.label_smoothing, self.simpo_gamma = float(alpha), float(label_smoothing), float(simpo_gamma)

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, 'CPOLoss')
        lengths = check_pairs(batch)
        policy = batch.row_sum(batch.logps)
        if self.loss_type == 'simpo':
            policy = policy / lengths
        z = self.beta * (policy[0::2] - policy[1::2])
        if self.loss_type == 'hinge':
            losses = torch.relu(1.0 - z)
        else:
            if self.loss_type == 'simpo':
                z = z - self.simpo_gamma
            ls = self.label_smoothing
            losses = -(1.0 - ls) * F.logsigmoid(z) - ls * F.logsigmoid(-z)
        nll = chosen_nll(batch)
        loss = losses.mean() + self.alpha * nll if self.alpha else losses.mean()
        metrics = reward_metrics(self.beta * policy[0::2].detach(), self.beta * policy[1::2].detach())
        metrics['nll'] = float(nll.detach())
        return LossOutput(loss=loss, num_tokens=batch.num_tokens, metrics=metrics)
