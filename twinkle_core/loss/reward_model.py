"""`BradleyTerryLoss`: train a reward model on (chosen, rejected) pairs.

The reward of a row is the value head's output at its **last token** (the position that has seen the whole
conversation, as Hugging Face's sequence-classification reward models read it). For each pair::

    loss = -log sigmoid(r_chosen - r_rejected - margin)  [+ center_coef * (r_chosen + r_rejected) ** 2]

averaged over pairs -- TRL's ``RewardTrainer.compute_loss`` (``margin``: the optional per-row field, read on the
chosen row; ``center_coef``: TRL's ``center_rewards_coefficient``, keeping rewards centred on 0). Rows come like
DPO's: row ``2i`` chosen, ``2i+1`` rejected (`twinkle_core.loss.pairs`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import Loss, LossOutput
from twinkle_core.loss.pairs import check_pairs, reward_metrics
from twinkle_core.loss.token_batch import TokenBatch


class BradleyTerryLoss(Loss):
    """Pairwise reward-model loss (kind ``loss``, name ``BradleyTerryLoss``); the model is a
    ``TransformersValueModel``. Metrics: ``rewards/chosen``, ``rewards/rejected``, ``margin``, ``accuracy`` (share
    of pairs ranked right)."""

    reduction = 'sequence_mean'
    needs_values = True
    row_keywords = frozenset()

    def __init__(self, center_coef: float = 0.0) -> None:
        if not center_coef >= 0:
            raise InvalidInputError(f'BradleyTerryLoss: center_coef must be >= 0, got {center_coef}.')
        self.center_coef = center_coef

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, 'BradleyTerryLoss', reads='values')
        check_pairs(batch)
        rewards = batch.row_final(outputs['values'].float())
        chosen, rejected = rewards[0::2], rewards[1::2]
        margin = batch.row_field('margin', required=False)
        diff = chosen - rejected - (margin[0::2] if margin is not None else 0.0)
        loss = -F.logsigmoid(diff).mean()
        if self.center_coef:
            loss = loss + self.center_coef * torch.mean((chosen + rejected) ** 2)
        return LossOutput(loss=loss, num_tokens=batch.num_tokens, metrics=reward_metrics(chosen, rejected))
