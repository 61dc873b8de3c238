"""What the pairwise preference losses (DPO, ORPO, CPO) share: the (chosen, rejected) row-pair layout, the
chosen rows' language-model term, and the implicit-reward metrics.

Layout: rows come in pairs -- row ``2i`` is the chosen completion and row ``2i+1`` the rejected one for the same
prompt (in a packed batch, "row" means the ``row_index`` segment).
"""

from __future__ import annotations

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.token_batch import TokenBatch

REWARD_METRICS = ('rewards/chosen', 'rewards/rejected', 'margin', 'accuracy')


def check_options(who: str, *, beta: float, loss_type: str, choices: tuple[str, ...], label_smoothing: float) -> None:
    """The constructor arguments the pairwise losses share: `loss_type` among `choices`, ``beta > 0``, and a
    `label_smoothing` in [0, 0.5) that only the sigmoid-shaped types (``'sigmoid'``, ``'simpo'``) take."""
    if loss_type not in choices:
        raise InvalidInputError(f'{who}: unknown loss_type {loss_type!r}; choose one of {", ".join(choices)}.')
    if not beta > 0:
        raise InvalidInputError(f'{who}: beta must be > 0, got {beta}.')
    if not 0.0 <= label_smoothing < 0.5:
        raise InvalidInputError(f'{who}: label_smoothing must be in [0, 0.5), got {label_smoothing}.')
    if label_smoothing and loss_type not in ('sigmoid', 'simpo'):
        raise InvalidInputError(f"{who}: label_smoothing applies to 'sigmoid' and 'simpo', not {loss_type!r}.")


def check_pairs(batch: TokenBatch) -> torch.Tensor:
    """Refuse a batch that is not (chosen, rejected) pairs or has a completion without loss tokens; each row's
    number of loss tokens -> [num_rows]."""
    name, lengths = batch.loss_name, batch.row_tokens()
    if batch.num_rows == 0 or batch.num_rows % 2:
        raise InvalidInputError(
            f'{name} needs (chosen, rejected) row pairs -- rows 2i chosen, 2i+1 rejected -- but the batch has '
            f'{batch.num_rows} rows; keep each pair in the same micro-batch.'
        )
    empty = (lengths == 0).nonzero()
    if empty.numel():
        row = int(empty[0, 0])
        raise InvalidInputError(
            f'{name}: row {row} ({"chosen" if row % 2 == 0 else "rejected"}) has no loss '
            'tokens; every completion needs labels != -100.'
        )
    return lengths


def chosen_nll(batch: TokenBatch) -> torch.Tensor:
    """The language-model loss of the chosen completions: -log-prob averaged over all their loss tokens (the
    cross-entropy of the chosen rows, as ORPO and CPO add it)."""
    chosen = (batch.rows % 2 == 0) & batch.mask
    return -(batch.logps * chosen).sum() / chosen.sum().clamp(min=1).to(batch.dtype)


def reward_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    """Mean implicit reward of the chosen and of the rejected rows, their mean margin, and the fraction of pairs
    whose chosen reward is higher."""
    with torch.no_grad():
        values = torch.stack(
            [chosen.mean(), rejected.mean(), (chosen - rejected).mean(), (chosen > rejected).to(chosen.dtype).mean()]
        ).tolist()
    return dict(zip(REWARD_METRICS, values))
