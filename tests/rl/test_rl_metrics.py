"""RL metrics: completion reward statistics and policy-update diagnostics against direct computations."""

from __future__ import annotations

import math
from statistics import pstdev

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.metric.rl import PolicyUpdateMetric
from twinkle_core.registry import resolve


def test_completion_reward_metric_accumulates_and_resets():
    metric = resolve('metric', 'CompletionRewardMetric', group_size=2)  # by name, as scripts do
    metric.accumulate(None, {'rewards': [1.0, 1.0, 0.0, 1.0], 'completion_lengths': [3, 5, 7, 9]})
    metric.accumulate(None, {'rewards': [0.0, 0.0]})
    got = metric.calculate()
    rewards = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    assert got['reward/mean'] == 0.5 and math.isclose(got['reward/std'], pstdev(rewards))
    assert (got['reward/min'], got['reward/max']) == (0.0, 1.0)
    assert (got['completion_length/mean'], got['completion_length/max']) == (6.0, 9.0)
    assert math.isclose(got['reward/zero_std_group_frac'], 2 / 3)  # [1,1] and [0,0] are flat, [0,1] is not
    metric.reset()
    assert metric.calculate() == {}
    with pytest.raises(InvalidInputError, match='2 completion_lengths for 3 rewards'):
        metric.accumulate(None, {'rewards': [1, 2, 3], 'completion_lengths': [1, 2]}, group_size=None)


def test_policy_update_metric_matches_direct_computation():
    g = torch.Generator().manual_seed(0)
    labels = torch.tensor([[-100, 3, 4, 5], [-100, -100, 6, -100]])
    mask = labels != -100
    lp = -torch.rand(2, 4, generator=g, dtype=torch.float64)
    old = lp + torch.randn(2, 4, generator=g, dtype=torch.float64) * 0.3
    ref = lp + torch.randn(2, 4, generator=g, dtype=torch.float64) * 0.3
    logits = torch.randn(2, 4, 7, generator=g, dtype=torch.float64)
    metric = PolicyUpdateMetric(epsilon=0.1)
    metric.accumulate({'labels': labels, 'old_logps': old, 'ref_logps': ref}, {'logps': lp, 'logits': logits})
    got = metric.calculate()
    r = torch.exp(lp - old)[mask]
    p = torch.softmax(logits, -1)[mask]
    d = (ref - lp)[mask]
    assert math.isclose(got['clip_frac'], float(((r < 0.9) | (r > 1.1)).double().mean()))
    assert math.isclose(got['approx_kl'], float((r - 1 - torch.log(r)).mean()), rel_tol=1e-9)
    assert math.isclose(got['kl_ref'], float((torch.exp(d) - d - 1).mean()), rel_tol=1e-9)
    assert math.isclose(got['entropy'], float(-(p * p.log()).sum(-1).mean()), rel_tol=1e-6)
    assert got['approx_kl'] > 0 and got['kl_ref'] > 0


def test_policy_update_metric_reports_only_what_the_batch_allows():
    metric = PolicyUpdateMetric()
    metric.accumulate({'labels': torch.tensor([[1, 2]])}, {'logps': torch.tensor([[-1.0, -2.0]])})
    assert metric.calculate() == {}


def test_completion_reward_metric_takes_named_rewards_as_keywords():
    """The Twinkle documents' form: ``accumulate(completion_lengths=..., rewards={name: [...]})``."""
    metric = resolve('metric', 'CompletionRewardMetric')
    metric.accumulate(
        completion_lengths=[3, 5, 4, 6],
        group_size=2,
        rewards={'total': [1.0, 1.0, 0.0, 2.0], 'format': [1.0, 1.0, 0.0, 1.0]},
    )
    out = metric.calculate()
    assert out['reward/total/mean'] == 1.0 and out['reward/format/max'] == 1.0
    assert out['completion_length/mean'] == 4.5 and out['reward/zero_std_group_frac'] == 0.5  # from 'total'
    with pytest.raises(InvalidInputError, match='different lengths'):
        metric.accumulate(rewards={'total': [1.0], 'format': [1.0, 0.0]})
    with pytest.raises(InvalidInputError, match="rewards 'format' must be finite"):
        metric.accumulate(rewards={'total': [1.0], 'format': [float('nan')]})
    metric.reset()
    assert metric.calculate() == {}
