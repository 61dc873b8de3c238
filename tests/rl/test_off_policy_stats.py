"""The off-policy statistics of an RL step: the IS ratio distribution against a hand computation, the run summary,
and on a real asynchronous run: ratio 1 for groups of the trainer's own version, off 1 for stale ones."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.rl.test_async_driver import PROMPTS, new_model, trainer, worker_factory
from twinkle_core.errors import InvalidInputError
from twinkle_core.rl import (
    AsyncRLDriver,
    RolloutContext,
    RolloutGroup,
    importance_ratio_stats,
    off_policy_line,
    summarize_off_policy,
)


def test_the_ratio_distribution_matches_a_hand_computation():
    rows = [
        {'input_ids': [1, 2, 3], 'labels': [-100, 2, 3], 'old_logps': [0.0, -1.0, -2.0]},
        {'input_ids': [1, 2], 'labels': [-100, -100], 'old_logps': [0.0, -9.0]},  # nothing trained: not counted
    ]
    stats = importance_ratio_stats(rows, [[0.0, -0.5, -2.5], [0.0, 0.0]])
    low, high = math.exp(-0.5), math.exp(0.5)  # log ratios -0.5 and +0.5
    expected = {
        'is_ratio_mean': (low + high) / 2,
        'is_ratio_min': low,
        'is_ratio_max': high,
        'is_ratio_p05': low + 0.05 * (high - low),
        'is_ratio_p50': (low + high) / 2,
        'is_ratio_p95': low + 0.95 * (high - low),
        'is_abs_log_ratio_mean': 0.5,
    }
    assert stats == pytest.approx(expected, rel=1e-12)
    assert importance_ratio_stats(rows[1:], [[0.0, 0.0]]) == {}


def test_rows_that_do_not_line_up_are_refused():
    row = {'input_ids': [1, 2], 'labels': [-100, 2], 'old_logps': [0.0, -1.0]}
    with pytest.raises(InvalidInputError, match='row 0 has 2 labels, 2 old_logps and 3 log-probs'):
        importance_ratio_stats([row], [[0.0, -1.0, -1.0]])
    with pytest.raises(InvalidInputError, match='row 0 has no old_logps'):
        importance_ratio_stats([{'input_ids': [1], 'labels': [1]}], [[0.0]])
    with pytest.raises(InvalidInputError, match='1 rows but 2 log-prob lists'):
        importance_ratio_stats([row], [[0.0, 0.0], [0.0, 0.0]])


def test_the_run_summary_takes_means_and_the_extremes():
    steps = [
        {'is_ratio_p50': 1.0, 'is_ratio_min': 0.5, 'is_ratio_max': 1.5, 'clip_frac': 0.0},
        {'is_ratio_p50': 2.0, 'is_ratio_min': 0.7, 'is_ratio_max': 3.0, 'clip_frac': 0.5},
        {'reward': 1.0},  # a step without the statistics counts for none of them
    ]
    summary = summarize_off_policy(steps)
    assert summary == {'is_ratio_p50': 1.5, 'clip_frac': 0.25, 'is_ratio_min': 0.5, 'is_ratio_max': 3.0}
    line = off_policy_line(summary)
    assert 'p05/p50/p95 n/a/1.500/n/a' in line and 'min/max 0.500/3.000' in line and 'clipped 25.00%' in line


class ParityRewards:
    """The repeat task's worker with reward 1 for an even first answer token: the untrained fixture model scores 0
    on the task itself, which would give zero advantages and leave the weights unchanged."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.sampler = inner, inner.sampler

    def __call__(self, context: RolloutContext) -> list[RolloutGroup]:
        groups = self.inner(context)
        for group in groups:
            group.rewards = [float(_first_answer_token(row) % 2 == 0) for row in group.rows]
        return groups


def _first_answer_token(row: dict[str, Any]) -> int:
    return next(token for token, label in zip(row['input_ids'], row['labels']) if label != -100)


def test_stale_groups_train_off_policy_and_fresh_ones_on_policy(tiny_model_dir):
    model = new_model(tiny_model_dir)
    make_worker = worker_factory(model)
    driver = AsyncRLDriver(
        model, lambda: ParityRewards(make_worker()), trainer(model), groups_per_step=PROMPTS, max_staleness=1
    )
    report = driver.run(3)
    fresh = [r for r in report.steps if max(r.staleness) == 0]
    stale = [r for r in report.steps if min(r.staleness) == 1]
    assert fresh and stale  # step 0 trains version 0; the sampler runs one version behind after it
    # the sampler's log-probs are the trainer's own for its current version (up to float32 kernel differences)...
    assert all(r.metrics['is_abs_log_ratio_mean'] < 1e-4 for r in fresh)
    # ...and those of the previous version for stale groups: the ratio the loss corrects for
    assert all(r.metrics['is_abs_log_ratio_mean'] > 1e-3 for r in stale)
    # the loss (GRPOLoss, against the rows' old_logps) saw the same ratios
    assert all(r.metrics['is_ratio_mean'] == pytest.approx(r.metrics['ratio_mean'], rel=1e-5) for r in report.steps)
    summary = report.summary()
    assert summary['is_ratio_min'] < 1.0 < summary['is_ratio_max']
    assert summary['is_ratio_p05'] <= summary['is_ratio_p50'] <= summary['is_ratio_p95']
