"""Warmup schedulers and registry-resolved optimizers/schedulers used by TransformersModel."""

from __future__ import annotations

import math

import pytest
import torch

from twinkle_core.errors import ComponentNotFoundError, InvalidInputError
from twinkle_core.registry import resolve


def lrs(name: str, steps: int, **kwargs) -> list[float]:
    optimizer = resolve('optimizer', 'SGD', params=[torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = resolve('lr_scheduler', name, optimizer=optimizer, **kwargs)
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]['lr'])
        optimizer.step()
        scheduler.step()
    return out


def test_cosine_warmup_shape():
    values = lrs('CosineWarmupScheduler', 14, num_warmup_steps=4, num_training_steps=12, min_lr_ratio=0.1)
    assert values[:5] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert values[8] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # half-way through decay
    assert values[12:] == pytest.approx([0.1, 0.1])  # held at min_lr_ratio after num_training_steps
    assert all(a >= b for a, b in zip(values[4:], values[5:]))


def test_linear_warmup_shape():
    values = lrs('LinearWarmupScheduler', 6, num_warmup_steps=0, num_training_steps=4)
    assert values == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0, 0.0])


def test_scheduler_state_round_trips():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = resolve(
        'lr_scheduler', 'CosineWarmupScheduler', optimizer=optimizer, num_warmup_steps=2, num_training_steps=10
    )
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    other_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    other = resolve(
        'lr_scheduler', 'CosineWarmupScheduler', optimizer=other_opt, num_warmup_steps=2, num_training_steps=10
    )
    other.load_state_dict(scheduler.state_dict())
    scheduler.step()
    other.step()
    assert other.get_last_lr() == scheduler.get_last_lr()


def test_torch_schedulers_and_optimizers_are_registered():
    optimizer = resolve('optimizer', 'AdamW', params=[torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    assert isinstance(optimizer, torch.optim.AdamW)
    scheduler = resolve('lr_scheduler', 'CosineAnnealingLR', optimizer=optimizer, T_max=5)
    assert isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingLR)
    with pytest.raises(ComponentNotFoundError, match='Did you mean: .*AdamW'):
        resolve('optimizer', 'AdamV')


def test_bad_schedule_arguments_are_rejected():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(InvalidInputError, match='min_lr_ratio must be in'):
        resolve('lr_scheduler', 'CosineWarmupScheduler', optimizer=optimizer, min_lr_ratio=2.0)
