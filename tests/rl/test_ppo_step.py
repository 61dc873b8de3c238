"""`PPOStep` as an `AsyncRLDriver`'s train step: PPO with a critic, asynchronously, on the tiny fixture."""

from __future__ import annotations

import math

import pytest

from tests.rl.test_async_driver import PROMPTS, new_model, worker_factory
from tests.rl.test_off_policy_stats import ParityRewards
from twinkle_core.advantage import GAEAdvantage
from twinkle_core.errors import InvalidInputError
from twinkle_core.registry import resolve_class
from twinkle_core.rl import AsyncRLDriver, PPOStep


def test_ppo_with_a_critic_runs_through_the_driver(tiny_model_dir):
    """The critic values each batch of rollouts and trains on GAE's returns beside the policy, whose loss gets
    per-token advantages; the worker runs one version ahead."""
    model = new_model(tiny_model_dir)
    model.set_loss('GRPOLoss', epsilon=0.2, loss_type='bnpo')
    critic = resolve_class('model', 'TransformersValueModel')(model_id=tiny_model_dir)
    critic.set_optimizer('AdamW', lr=1e-3)
    step = PPOStep(model, critic, GAEAdvantage(gamma=1.0, lam=0.95), updates_per_batch=2)
    make_worker = worker_factory(model)
    driver = AsyncRLDriver(model, lambda: ParityRewards(make_worker()), step, groups_per_step=PROMPTS, max_staleness=1)
    report = driver.run(3)
    assert len(report.steps) == 3 and [max(r.staleness) for r in report.steps][1:] == [1, 1]
    for record in report.steps:
        assert {'critic/value_loss', 'critic/explained_variance', 'clip_frac'} <= set(record.metrics), record.metrics
        assert math.isfinite(record.metrics['critic/value_loss'])
    assert report.steps[0].metrics['critic/values_mean'] == 0.0  # a new head values every state 0...
    assert report.steps[-1].metrics['critic/values_mean'] != 0.0  # ...and has learnt since
    assert 0 < report.steps[0].metrics['reward'] < 1  # the parity rewards vary: there is something to learn
    with pytest.raises(InvalidInputError, match='updates_per_batch'):
        PPOStep(model, critic, GAEAdvantage(), updates_per_batch=0)


def test_rollout_explained_variance_is_the_whole_batchs_not_a_mean_of_shards():
    """Over every trained token of the batch, equal to the loss's formula on the flattened tokens; the mean of two
    half-batches' figures (what a data-parallel loss metric reports) is not it."""
    import torch

    from twinkle_core.loss.value import explained_variance
    from twinkle_core.rl.ppo import rollout_explained_variance

    returns = [[1.0, 1.0], [1.0, 0.9], [0.0, 0.1], [0.0, 0.0]]
    values = [[0.8, 0.9], [0.7, 0.8], [0.3, 0.2], [0.1, 0.0]]
    flat = [torch.tensor([x for row in rows for x in row], dtype=torch.float64) for rows in (values, returns)]
    whole = rollout_explained_variance(values, returns)
    assert whole == pytest.approx(explained_variance(*flat), abs=1e-12)
    halves = [rollout_explained_variance(values[i : i + 2], returns[i : i + 2]) for i in (0, 2)]
    assert abs(sum(halves) / 2 - whole) > 1.0  # each half's returns barely vary: its figure is far below
    assert math.isnan(rollout_explained_variance([[0.5, 0.2]], [[1.0, 1.0]]))  # constant returns
