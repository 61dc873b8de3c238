"""DPO-family preference losses (DPO, IPO, SimPO).

Batch layout: (chosen, rejected) row pairs (`twinkle_core.loss.pairs`). Per row, ``pi`` is the sum of
``outputs['logps']`` over its loss tokens, ``ref`` the same sum of the per-token input ``ref_logps`` (the
reference model's log-probs; not needed for SimPO or ``reference_free=True``), and ``n`` its number of loss tokens.

====================  ===============================================================================
loss_type             loss per pair (then averaged over pairs)
====================  ===============================================================================
``'sigmoid'`` (DPO)   ``z = beta*((pi_c - ref_c) - (pi_r - ref_r))``;
                      ``-(1-ls)*logsigmoid(z) - ls*logsigmoid(-z)``   (ls = label_smoothing)
``'ipo'``             ``h = (pi_c - ref_c)/n_c - (pi_r - ref_r)/n_r``;  ``(h - 1/(2*beta))^2``
``'simpo'``           ``z = beta*(pi_c/n_c - pi_r/n_r) - simpo_gamma``;  same as sigmoid
====================  ===============================================================================

Metrics: ``rewards/chosen`` and ``rewards/rejected`` (mean implicit reward: ``beta*(pi - ref)`` for sigmoid,
length-normalised for ipo, ``beta*pi/n`` for simpo), ``margin`` (mean chosen - rejected reward) and
``accuracy`` (fraction of pairs whose chosen reward is higher).
"""

from __future__ import annotations

from typing import Any, Literal

import torch.nn.functional as F

from twinkle_core.loss.base import Loss, LossOutput
from twinkle_core.loss.pairs import check_options, check_pairs, reward_metrics
from twinkle_core.loss.token_batch import TokenBatch

DPOLossType = Literal['sigmoid', 'ipo', 'simpo']
DPO_TYPES = ('sigmoid', 'ipo', 'simpo')


class DPOLoss(Loss):
    """Direct preference optimisation on interleaved (chosen, rejected) row pairs; see the module docstring."""

    row_keywords = frozenset()
    reduction = 'sequence_mean'

    def __init__(
        self,
        beta: float = 0.1,
        loss_type: DPOLossType = 'sigmoid',
        label_smoothing: float = 0.0,
        reference_free: bool = False,
        simpo_gamma: float = 0.5,
    ) -> None:
        check_options('DPOLoss', beta=beta, loss_type=loss_type, choices=DPO_TYPES, label_smoothing=label_smoothing)
        self.beta, self.loss_type = float(beta), loss_type
        self.label_smoothing, self.simpo_gamma = float(label_smoothing), float(simpo_gamma)
        self.reference_free = reference_free or loss_type == 'simpo'

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, 'DPOLoss')
        policy, lengths = batch.row_sum(batch.logps), check_pairs(batch)
        ratio = policy if self.reference_free else policy - batch.row_sum(batch.token_field('ref_logps'))
        if self.loss_type != 'sigmoid':  # ipo and simpo use length-normalised log-probs
            ratio = ratio / lengths
        chosen, rejected = ratio[0::2], ratio[1::2]
        if self.loss_type == 'ipo':
            losses = (chosen - rejected - 1.0 / (2.0 * self.beta)) ** 2
        else:
            z = self.beta * (chosen - rejected)
            if self.loss_type == 'simpo':
                z = z - self.simpo_gamma
            ls = self.label_smoothing
            losses = -(1.0 - ls) * F.logsigmoid(z) - ls * F.logsigmoid(-z)
        metrics = reward_metrics(self.beta * chosen, self.beta * rejected)
        return LossOutput(loss=losses.mean(), num_tokens=batch.num_tokens, metrics=metrics)
