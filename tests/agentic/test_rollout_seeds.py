"""A seeded GRPO group through `MultiTurnRollout`: the group's G episodes are sent as G identical prompts with one
sample each, and with a seed they must still be G different episodes (identical ones make every advantage 0)."""

from __future__ import annotations

from scripted_policy import trainable_runs

from twinkle_agentic.rollout import MultiTurnRollout


def test_a_seeded_group_of_identical_prompts_gives_different_episodes(torch_sampler, template):
    group = [{'messages': [{'role': 'user', 'content': 'Say something.'}]}] * 4
    params = {'max_tokens': 8, 'temperature': 2.0, 'seed': 7}
    episodes = MultiTurnRollout(torch_sampler, template, max_turns=1, sampling_params=params)(group)
    turns = [tuple(trainable_runs(e)[0]) for e in episodes]
    assert len(set(turns)) == len(group), turns  # before: one episode, four times
    again = MultiTurnRollout(torch_sampler, template, max_turns=1, sampling_params=params)(group)
    assert [tuple(trainable_runs(e)[0]) for e in again] == turns  # and the seed still reproduces the group
