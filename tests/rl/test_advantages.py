"""GRPO and RLOO advantages against hand-computed examples, and their input errors."""

from __future__ import annotations

import pytest

from twinkle_core.advantage.group_relative import GRPOAdvantage, RLOOAdvantage
from twinkle_core.errors import ComponentNotFoundError, InvalidInputError
from twinkle_core.registry import resolve

# Two groups of 3: rewards [1, 0, 0] (mean 1/3, sample std 1/sqrt(3)) and [2, 2, 2] (no signal).
REWARDS = [1.0, 0.0, 0.0, 2.0, 2.0, 2.0]
INV_SQRT3 = 3**-0.5


def close(got, want, tol=1e-9):
    assert len(got) == len(want) and all(abs(g - w) < tol for g, w in zip(got, want)), (got, want)


def test_grpo_group_scale():
    got = GRPOAdvantage(epsilon=0.0)(REWARDS, group_size=3)
    close(got, [(2 / 3) / INV_SQRT3, (-1 / 3) / INV_SQRT3, (-1 / 3) / INV_SQRT3, 0.0, 0.0, 0.0])


def test_grpo_group_scale_epsilon_is_added_to_std():
    got = GRPOAdvantage(epsilon=0.5)(REWARDS, group_size=3)
    close(got[:3], [(2 / 3) / (INV_SQRT3 + 0.5), (-1 / 3) / (INV_SQRT3 + 0.5), (-1 / 3) / (INV_SQRT3 + 0.5)])


def test_grpo_batch_and_no_scale():
    # batch std of [1,0,0,2,2,2]: mean 7/6, sum of squares of deviations = 1/36+49/36*2+25/36*3 = 174/36; /5
    batch_std = (174 / 36 / 5) ** 0.5
    close(
        GRPOAdvantage(scale='batch', epsilon=0.0)(REWARDS, group_size=3),
        [(2 / 3) / batch_std, (-1 / 3) / batch_std, (-1 / 3) / batch_std, 0.0, 0.0, 0.0],
    )
    close(GRPOAdvantage(scale='none')(REWARDS, group_size=3), [2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])


def test_grpo_positive_only_keeps_the_completions_that_beat_their_group():
    plain = GRPOAdvantage()([1.0, 0.0, 0.0, 1.0, 0.5, 0.5], group_size=3)
    values = GRPOAdvantage(positive_only=True)([1.0, 0.0, 0.0, 1.0, 0.5, 0.5], group_size=3)
    assert values[0] == plain[0] > 0 and values[1:3] == [0.0, 0.0] and plain[1] < 0  # below the mean: 0
    assert values[3] == plain[3] > 0 and values[4:] == [0.0, 0.0]


def test_grpo_flat_group_with_zero_epsilon_is_zero_not_an_error():
    close(GRPOAdvantage(epsilon=0.0)([5.0, 5.0], group_size=2), [0.0, 0.0])


def test_rloo():
    # group 1: 1 - mean(0,0) = 1; 0 - mean(1,0) = -0.5; group 2: all equal -> 0
    close(RLOOAdvantage()(REWARDS, group_size=3), [1.0, -0.5, -0.5, 0.0, 0.0, 0.0])
    close(RLOOAdvantage()([3.0, 1.0], group_size=2), [2.0, -2.0])


@pytest.mark.parametrize('cls', [GRPOAdvantage, RLOOAdvantage])
def test_group_size_mismatch_and_bad_values_raise(cls):
    with pytest.raises(InvalidInputError, match='got 5 rewards, which is not a positive multiple of group_size=3'):
        cls()(REWARDS[:5], group_size=3)
    with pytest.raises(InvalidInputError, match='group_size must be an int >= 2'):
        cls()(REWARDS, group_size=1)
    with pytest.raises(InvalidInputError, match='reward 4 \\(group 1\\) is nan'):
        cls()([1, 0, 0, 1, float('nan'), 0], group_size=3)
    with pytest.raises(InvalidInputError, match='not a positive multiple'):
        cls()([], group_size=2)


def test_resolve_by_name_and_unknown_names():
    assert isinstance(resolve('advantage', 'GRPOAdvantage', scale='none'), GRPOAdvantage)
    assert isinstance(resolve('advantage', 'RLOOAdvantage'), RLOOAdvantage)
    with pytest.raises(InvalidInputError, match="scale must be 'group', 'batch' or 'none'"):
        GRPOAdvantage(scale='std')
    with pytest.raises(ComponentNotFoundError):
        resolve('advantage', 'GRPOAdvantag')


def test_the_twinkle_documents_call_form():
    """``advantage_fn(rewards, num_generations=G, scale=...).tolist()``: the scale given per call applies."""
    from twinkle_core.advantage import GRPOAdvantage, RLOOAdvantage

    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    plain = GRPOAdvantage()(rewards, num_generations=3, scale='none')
    assert plain.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3])
    assert GRPOAdvantage(scale='none')(rewards, num_generations=3, scale='group').tolist() == pytest.approx(
        GRPOAdvantage()(rewards, group_size=3)
    )
    assert RLOOAdvantage()(rewards, num_generations=3).tolist() == RLOOAdvantage()(rewards, group_size=3)
    with pytest.raises(TypeError, match=r'exactly once \(both given\)'):
        GRPOAdvantage()(rewards, group_size=3, num_generations=3)
    with pytest.raises(TypeError, match=r'exactly once \(neither given\)'):
        RLOOAdvantage()(rewards)
    with pytest.raises(TypeError, match='unexpected keyword'):
        GRPOAdvantage()(rewards, group_size=3, scale_rewards=True)
    with pytest.raises(InvalidInputError, match='scale must be'):
        GRPOAdvantage()(rewards, group_size=3, scale='std')


def test_a_callable_advantage_takes_the_group_size_in_either_spelling():
    """`Advantage.from_callable` honours the interface like the built-ins: ``num_generations=`` is ``group_size=``."""
    from twinkle_core.advantage.base import Advantage

    def centred(rewards, group_size, shift=0.0):
        return [
            r - sum(rewards[i // group_size * group_size :][:group_size]) / group_size + shift
            for i, r in enumerate(rewards)
        ]

    adv = Advantage.from_callable(centred, shift=1.0)
    assert (
        adv(REWARDS, group_size=3)
        == adv(REWARDS, num_generations=3)
        == pytest.approx([1 + 2 / 3, 1 - 1 / 3, 1 - 1 / 3, 1.0, 1.0, 1.0])
    )
    with pytest.raises(TypeError, match=r'exactly once \(neither given\)'):
        adv(REWARDS)
