"""What every value-model backend shares (a causal LM with a scalar head: a PPO critic or a reward model).

- the head is Hugging Face's: ``score``, a ``[1, hidden]`` linear without bias, as ``*ForSequenceClassification``
  models name it (``score.weight`` in a full checkpoint, ``base_model.model.score.weight`` in a PEFT adapter,
  where it is trained in full beside the LoRA factors: PEFT's ``modules_to_save``);
- how a new head starts (`new_head_weight`), the losses a value model accepts (`check_value_loss`) and its
  per-row outputs (`value_row_outputs`).
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.token_batch import row_end_values
from twinkle_core.train.loss_step import rows_logprobs

HEAD = 'score'  # the scalar head's module name in transformers' sequence-classification models
HEAD_WEIGHT = f'{HEAD}.weight'
HEAD_INITS = ('zero', 'normal')
DEFAULT_VALUE_LOSS = 'PPOValueLoss'


def check_head_init(how: str) -> str:
    if how not in HEAD_INITS:
        raise InvalidInputError(f'head_init must be one of {HEAD_INITS}, got {how!r}.')
    return how


def new_head_weight(hidden_size: int, how: str, *, seed: int, std: float) -> torch.Tensor:
    """A new head's ``[1, hidden_size]`` float32 weight. ``'zero'``: a new critic values every state 0, so its first
    GAE advantages are the plain returns rather than noise from a random head; ``'normal'``: N(0, `std`) drawn
    from `seed` (a reward model trained from scratch learns faster, its backbone getting gradients from the first
    step). The same draw on every backend and every rank."""
    if check_head_init(how) == 'zero':
        return torch.zeros(1, hidden_size)
    return torch.randn(1, hidden_size, generator=torch.Generator().manual_seed(seed)) * std


def check_value_loss(loss: object) -> None:
    """Refuse a loss that reads log-probs: a value model gives per-token values."""
    if loss is not None and not getattr(loss, 'needs_values', False):
        raise InvalidInputError(
            f'{getattr(loss, "__name__", type(loss).__name__)} reads log-probs, but a value model gives per-token '
            'values: use PPOValueLoss or BradleyTerryLoss (or a Loss with needs_values = True).'
        )


def value_row_outputs(batch: dict[str, Any], values: torch.Tensor) -> dict[str, list[Any]]:
    """Per row of a collated batch (padded or packed), from the head at every position ``values`` [B, T]:
    ``values`` aligned with the row's ``input_ids`` like ``logprobs`` (element i = the value of the state before
    token i, element 0 = 0.0) and ``scores``, the head after the row's last token (a reward model's score)."""
    values = values.detach().float()
    last = row_end_values(values, batch['row_lengths'], packed=bool(batch.get('packed')))
    return {'values': rows_logprobs(batch, values), 'scores': last.cpu().tolist()}
