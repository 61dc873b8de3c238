"""MultiTurnRollout with a Ray sampler group as its sampler (examples/seeds-style): the group splits each turn's
batch across its ranks, and the episodes equal those of a local sampler under greedy sampling."""

from __future__ import annotations

from typing import Any

import pytest

import twinkle_core
from twinkle_agentic.envs import GuessNumberEnv
from twinkle_agentic.rollout import MultiTurnRollout
from twinkle_core.mesh import DeviceGroup
from twinkle_core.registry import resolve_class
from twinkle_core.types import IGNORE_INDEX

pytest.importorskip('ray')


def play(sampler: Any, tokenizer: Any) -> list[dict]:
    """Four greedy games of guess-the-number (plain-text guesses). A greedy random model rarely ends its turn, so
    most of the vocabulary (all ids but every 4th) also ends one: short turns, games of several turns."""
    stop = [i for i in range(3, len(tokenizer)) if i % 4]
    rollout = MultiTurnRollout(
        sampler,
        tokenizer,
        env=GuessNumberEnv,
        env_kwargs={'low': 1, 'high': 8, 'max_guesses': 3, 'tool': False},
        sampling_params={'max_tokens': 8, 'temperature': 0.0, 'stop': stop},
        max_turns=3,
    )
    games = [
        {'messages': [{'role': 'system', 'content': f'Game {i}.'}], 'user_data': {'secret': 1 + i}} for i in range(4)
    ]
    return rollout(games)


@pytest.mark.slow
def test_multi_turn_rollout_with_a_ray_sampler_group(ray_cluster, tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    sampler_cls = resolve_class('sampler', 'TorchSampler')
    twinkle_core.initialize(mode='ray', groups=[DeviceGroup(name='sampler', ranks=2)])
    try:
        remote = play(sampler_cls(model_id=str(tiny_model_dir), remote_group='sampler'), tokenizer)
    finally:
        twinkle_core.shutdown()
    local = play(sampler_cls(model_id=str(tiny_model_dir), device='cpu'), tokenizer)

    assert max(e['turns'] for e in remote) >= 2  # the env's hints came back and the games went on
    assert [e['input_ids'] for e in remote] == [e['input_ids'] for e in local]
    assert [e['labels'] for e in remote] == [e['labels'] for e in local]
    assert [e['stop_reason'] for e in remote] == [e['stop_reason'] for e in local]
    for r, loc in zip(remote, local):
        assert len(r['logprobs']) == sum(label != IGNORE_INDEX for label in r['labels'])
        assert r['logprobs'] == pytest.approx(loc['logprobs'], abs=1e-4)
