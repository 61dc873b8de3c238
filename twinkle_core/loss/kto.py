"""KTO: Kahneman-Tversky optimisation (Ethayarajh et al., 2024) on unpaired desirable / undesirable completions.

Per row, ``r = pi - ref`` is the sum of ``outputs['logps']`` minus the sum of the per-token input ``ref_logps``
over its loss tokens (the policy's log-ratio to the reference model). The per-row field ``kto_label`` says what
the row is: ``1`` desirable, ``0`` undesirable, ``-1`` a *KL row* -- a completion paired with another example's
prompt, used only to estimate the reference point.

``z0 = max(0, mean(r over the KL rows))``, detached (with no KL rows in the batch: over all rows;
``reference_point='zero'``: 0). Then per labelled row::

    desirable:    desirable_weight   * (1 - sigmoid(beta * (r - z0)))
    undesirable:  undesirable_weight * (1 - sigmoid(beta * (z0 - r)))

and the loss is their mean over the labelled rows. This is TRL's ``kto_loss`` (``trl/trainer/kto_trainer.py``,
loss_type ``'kto'``), whose KL term comes from mismatched pairs in the same way. Rows need not be paired, and the
weights rebalance unequal numbers of desirable and undesirable examples (the paper: keep
``desirable_weight * n_desirable / (undesirable_weight * n_undesirable)`` within [1, 4/3]).

Metrics: ``rewards/chosen`` / ``rewards/rejected`` (mean ``beta * r`` of the desirable / undesirable rows, 0 if
the batch has none), ``kl`` (``z0``), ``desirable`` (how many desirable rows).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.base import Loss, LossOutput
from twinkle_core.loss.token_batch import TokenBatch

ReferencePoint = Literal['kl', 'zero']
LABELS = {1: 'desirable', 0: 'undesirable', -1: 'a KL row'}


class KTOLoss(Loss):
    """Kahneman-Tversky optimisation on rows labelled by the per-row field ``kto_label``; see the module
    docstring."""

    row_keywords = frozenset()
    reduction = 'sequence_mean'

    def __init__(
        self,
        beta: float = 0.1,
        desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0,
        reference_point: ReferencePoint = 'kl',
    ) -> None:
        if beta <= 0:
            raise InvalidInputError(f'KTOLoss: beta must be > 0, got {beta}.')
        if desirable_weight <= 0 or undesirable_weight <= 0:
            raise InvalidInputError(
                f'KTOLoss: desirable_weight and undesirable_weight must be > 0, got {desirable_weight} and '
                f'{undesirable_weight}.'
            )
        if reference_point not in ('kl', 'zero'):
            raise InvalidInputError(f"KTOLoss: reference_point must be 'kl' or 'zero', got {reference_point!r}.")
        self.beta, self.reference_point = float(beta), reference_point
        self.desirable_weight, self.undesirable_weight = float(desirable_weight), float(undesirable_weight)

    def __call__(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> LossOutput:
        batch = TokenBatch(inputs, outputs, 'KTOLoss')
        labels = self._labels(batch)
        ratio = batch.row_sum(batch.logps) - batch.row_sum(batch.token_field('ref_logps'))
        desirable, undesirable, kl_rows = labels == 1, labels == 0, labels == -1
        z0 = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
        if self.reference_point == 'kl':
            source = ratio[kl_rows] if bool(kl_rows.any()) else ratio
            z0 = source.detach().mean().clamp(min=0)
        losses = torch.where(
            desirable,
            self.desirable_weight * (1 - torch.sigmoid(self.beta * (ratio - z0))),
            self.undesirable_weight * (1 - torch.sigmoid(self.beta * (z0 - ratio))),
        )
        labelled = desirable | undesirable
        loss = (losses * labelled).sum() / labelled.sum().to(losses.dtype)
        with torch.no_grad():
            rewards = self.beta * ratio

            def mean_of(rows: torch.Tensor) -> float:
                return float(rewards[rows].mean()) if bool(rows.any()) else 0.0

            metrics = {
                'rewards/chosen': mean_of(desirable),
                'rewards/rejected': mean_of(undesirable),
                'kl': float(z0),
                'desirable': float(desirable.sum()),
            }
        return LossOutput(loss=loss, num_tokens=batch.num_tokens, metrics=metrics)

    @staticmethod
    def _labels(batch: TokenBatch) -> torch.Tensor:
        labels = batch.row_field('kto_label')
        unknown = ~(labels == 1) & ~(labels == 0) & ~(labels == -1)
        if bool(unknown.any()):
            row = int(unknown.nonzero()[0, 0])
            raise InvalidInputError(
                f'KTOLoss: kto_label of row {row} is {labels[row].item()}; use 1 (desirable), 0 (undesirable) or -1 '
                '(a KL row: a completion under another prompt, for the reference point).'
            )
        if not bool(((labels == 1) | (labels == 0)).any()):
            raise InvalidInputError(
                'KTOLoss: the batch has no desirable (kto_label 1) or undesirable (kto_label 0) row, only KL rows; '
                'keep labelled rows in every micro-batch.'
            )
        empty = (batch.row_tokens() == 0).nonzero()
        if empty.numel():
            row = int(empty[0, 0])
            raise InvalidInputError(
                f'KTOLoss: row {row} ({LABELS[int(labels[row])]}) has no loss tokens; every completion needs '
                'labels != -100.'
            )
        return labels.to(torch.long)
