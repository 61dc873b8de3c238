"""`RolloutBuffer`: streaming takes, the staleness bound (stale groups dropped and counted), closing."""

from __future__ import annotations

import threading

import pytest

from twinkle_core.rl import RolloutBuffer, RolloutGroup
from twinkle_core.rl.rollout_buffer import BufferClosed


def group(version: int | None, tag: str = '') -> RolloutGroup:
    return RolloutGroup([{'input_ids': [1]}], [0.0], policy_version=version, info={'tag': tag})


def test_take_drops_and_counts_groups_older_than_max_staleness():
    buffer = RolloutBuffer(groups_per_step=2, max_staleness=1)
    buffer.put([group(0, 'a'), group(2, 'b'), group(1, 'c'), group(3, 'd')])
    taken, dropped = buffer.take(step=2)  # versions >= 1 are fresh enough
    assert [g.info['tag'] for g in taken] == ['b', 'c']
    assert dropped == 1 and buffer.dropped == 1
    assert buffer.position() == 3  # two consumed, one queued


def test_token_versions_make_a_group_as_old_as_its_oldest_token():
    partial = RolloutGroup([{}, {}], [1.0, 0.0], token_versions=[[3, 3, 4], [4, 5]])
    assert partial.policy_version == 3
    buffer = RolloutBuffer(groups_per_step=1, max_staleness=0)
    buffer.put([partial, group(4)])
    taken, dropped = buffer.take(step=4)
    assert dropped == 1 and taken[0].policy_version == 4


def test_a_step_streams_from_whichever_groups_arrive_first():
    buffer = RolloutBuffer(groups_per_step=2, max_staleness=0)
    got: list[list[str]] = []
    taker = threading.Thread(target=lambda: got.append([g.info['tag'] for g in buffer.take(0)[0]]))
    taker.start()
    buffer.put([group(0, 'fast')])
    buffer.put([group(0, 'second')])
    taker.join(timeout=10)
    assert got == [['fast', 'second']]


def test_close_wakes_a_waiting_trainer_with_the_reason():
    buffer = RolloutBuffer(groups_per_step=1, max_staleness=0)
    errors: list[BaseException] = []

    def take() -> None:
        try:
            buffer.take(0)
        except BufferClosed as exc:
            errors.append(exc)

    taker = threading.Thread(target=take)
    taker.start()
    buffer.close(RuntimeError('sampler exploded'))
    taker.join(timeout=10)
    assert errors and 'sampler exploded' in str(errors[0])
    with pytest.raises(BufferClosed):
        buffer.put([group(0)])


@pytest.mark.parametrize(
    'kwargs', [{'groups_per_step': 0, 'max_staleness': 0}, {'groups_per_step': 1, 'max_staleness': -1}]
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match='must be >='):
        RolloutBuffer(**kwargs)


def test_rows_and_rewards_must_match():
    with pytest.raises(ValueError, match='2 rows but 1 rewards'):
        RolloutGroup([{}, {}], [1.0])
