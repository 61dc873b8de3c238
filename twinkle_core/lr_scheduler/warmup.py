"""Warmup + decay LR schedules (torch `LRScheduler`s: checkpointable with `state_dict`, resumable exactly).

Both multiply each parameter group's initial lr by a factor of the step count ``s`` (calls to ``step()``):
warmup ``s / num_warmup_steps`` for ``s < num_warmup_steps`` (Hugging Face convention: the first step runs at
lr 0 when warming up), then a decay from 1 to `min_lr_ratio` reached at ``num_training_steps`` and held after.
"""

from __future__ import annotations

import math

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from twinkle_core.errors import InvalidInputError


class _WarmupDecayScheduler(LRScheduler):
    def __init__(
        self,
        optimizer: Optimizer,
        num_warmup_steps: int = 0,
        num_training_steps: int = 1000,
        min_lr_ratio: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        if num_warmup_steps < 0 or num_training_steps < 1:
            raise InvalidInputError(
                f'{type(self).__name__}: need num_warmup_steps >= 0 and num_training_steps >= 1, '
                f'got {num_warmup_steps} and {num_training_steps}.'
            )
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise InvalidInputError(f'{type(self).__name__}: min_lr_ratio must be in [0, 1], got {min_lr_ratio}.')
        self.num_warmup_steps = num_warmup_steps
        self.num_training_steps = num_training_steps
        self.min_lr_ratio = min_lr_ratio
        super().__init__(optimizer, last_epoch)

    def decay(self, progress: float) -> float:
        """Decay factor in [0, 1] at `progress` in [0, 1] (1 -> 0)."""
        raise NotImplementedError

    def lr_factor(self, step: int) -> float:
        if step < self.num_warmup_steps:
            return step / self.num_warmup_steps
        span = max(1, self.num_training_steps - self.num_warmup_steps)
        progress = min(1.0, (step - self.num_warmup_steps) / span)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * self.decay(progress)

    def get_lr(self) -> list[float | Tensor]:  # torch types base_lrs as floats or tensors (a tensor lr)
        factor = self.lr_factor(self.last_epoch)
        return [base * factor for base in self.base_lrs]


class CosineWarmupScheduler(_WarmupDecayScheduler):
    """Linear warmup, then half-cosine decay to ``min_lr_ratio * lr`` at `num_training_steps`."""

    def decay(self, progress: float) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * progress))


class LinearWarmupScheduler(_WarmupDecayScheduler):
    """Linear warmup, then linear decay to ``min_lr_ratio * lr`` at `num_training_steps`."""

    def decay(self, progress: float) -> float:
        return 1.0 - progress
