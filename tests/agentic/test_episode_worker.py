"""EpisodeWorker: multi-turn episodes as `AsyncRLDriver` rollout groups -- one group per `group_size` prompts, the
env's rewards, each sampled token's version, and the sampler's log-probs at the episode's label positions."""

from __future__ import annotations

import pytest
from scripted_policy import ScriptedSampler
from test_rollout import binary_search, games

from twinkle_agentic.rollout import EpisodeWorker, MultiTurnRollout
from twinkle_core.rl import RolloutContext
from twinkle_core.types import IGNORE_INDEX

pytestmark = pytest.mark.usefixtures('tiny_model_dir')


def worker(torch_sampler, template, prompts, group_size, env='GuessNumberEnv'):
    policy = ScriptedSampler(torch_sampler, template.tokenizer, binary_search)
    rollout = MultiTurnRollout(policy, template, env=env, max_turns=2, sampling_params={'max_tokens': 64})
    return EpisodeWorker(rollout, lambda: prompts, group_size)


def test_groups_carry_rewards_versions_and_old_logps_at_the_labels(torch_sampler, template):
    # bisection from 50: secret 50 is found in one turn (reward 1), 73 and 1 are not found in two (reward 0)
    groups = worker(torch_sampler, template, games([50, 50, 73, 1]), 2)(RolloutContext(0, 7, lambda: 7))
    assert [g.rewards for g in groups] == [[1.0, 1.0], [0.0, 0.0]]
    for group in groups:
        for row, versions in zip(group.rows, group.token_versions):
            trained = [i for i, label in enumerate(row['labels']) if label != IGNORE_INDEX]
            assert versions == [7] * len(trained)
            old = row['old_logps']
            assert len(old) == len(row['input_ids'])
            assert [old[i] for i in trained] == pytest.approx(row['logprobs'])  # each at its label position
            assert all(old[i] == 0.0 for i in range(len(old)) if i not in set(trained))


def test_prompts_that_are_not_whole_groups_and_episodes_without_rewards_are_refused(torch_sampler, template):
    context = RolloutContext(0, 0, lambda: 0)
    with pytest.raises(ValueError, match='3 prompts is not a whole number of groups of 2'):
        worker(torch_sampler, template, games([50, 73, 1]), 2)(context)
    with pytest.raises(ValueError, match='an episode has no reward'):
        worker(torch_sampler, template, games([50, 73]), 2, env=None)(context)
