"""Agentic RL through the service, driven by the unmodified `tinker` SDK: `MultiTurnRollout` samples with a
`SamplingClient` (`TinkerSampler`), plays GuessNumberEnv client-side, and one importance-sampling step trains the
LoRA on the episodes (`episode_datum`). Token accounting is checked against the service's raw responses."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from server_names import MODEL
from tinker import types

from twinkle_agentic.envs import GuessNumberEnv
from twinkle_agentic.rollout import MultiTurnRollout, TinkerSampler, episode_datum
from twinkle_core.types import IGNORE_INDEX

GAME = {'low': 1, 'high': 8, 'max_guesses': 3, 'tool': False}


class RecordingClient:
    """A tinker `SamplingClient` that records each request's prompt and future (the service's raw answer)."""

    def __init__(self, client: Any) -> None:
        self.client, self.calls = client, []

    def sample(self, *, prompt, **kwargs):
        future = self.client.sample(prompt=prompt, **kwargs)
        self.calls.append((prompt.to_ints(), future))
        return future


def games(n: int) -> list[dict]:
    """`n` distinct games (the system turn names each, so every sampled prompt belongs to one episode)."""
    return [
        {'messages': [{'role': 'system', 'content': f'Game {i}.'}], 'user_data': {'secret': 1 + i}} for i in range(n)
    ]


def check_against_service(episodes: list[dict], calls: list) -> None:
    """Each episode's trained tokens and log-probs are exactly what the service returned for its prompts, in
    order; every other token (prompt, env turns, template glue) has label -100."""
    for e in episodes:
        ids, labels = e['input_ids'], e['labels']
        mine = [(p, f.result().sequences[0]) for p, f in calls if ids[: len(p)] == p]
        assert len(mine) == e['turns'] > 0
        trained = [False] * len(ids)
        for prompt, seq in mine:
            span = range(len(prompt), len(prompt) + len(seq.tokens))
            assert [ids[i] for i in span] == [labels[i] for i in span] == seq.tokens
            for i in span:
                trained[i] = True
        assert all(label == IGNORE_INDEX for label, t in zip(labels, trained) if not t)
        assert e['logprobs'] == [lp for _, seq in mine for lp in seq.logprobs]
        assert len(e['logprobs']) == sum(trained)


def test_multi_turn_rl_through_the_tinker_sdk(service_client, tokenizer):
    training = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=0).result()
    client = RecordingClient(training.save_weights_and_get_sampling_client().result())
    # a random model rarely ends its turn: most of the vocabulary (all ids but every 4th) ends one
    stop = [i for i in range(3, len(tokenizer)) if i % 4]
    rollout = MultiTurnRollout(
        TinkerSampler(client, timeout_s=60),
        tokenizer,
        env=GuessNumberEnv,
        env_kwargs=GAME,
        sampling_params={'max_tokens': 6, 'temperature': 1.0, 'seed': 0, 'stop': stop},
        max_turns=3,
    )
    episodes = rollout(games(4))

    assert [e['user_data']['secret'] for e in episodes] == [1, 2, 3, 4]
    assert 'tools' not in episodes[0] and '<tools>' not in tokenizer.decode(episodes[0]['input_ids'])
    assert any(e['turns'] > 1 for e in episodes)  # the env's hints came back as turns
    assert len(client.calls) == sum(e['turns'] for e in episodes)
    for e in episodes:
        assert e['reward'] in (0.0, 1.0) and e['stop_reason'] in ('stop', 'max_turns', 'length')
    check_against_service(episodes, client.calls)

    # one RL step: the random base model rarely wins (rewards all 0), so fixed +-1 advantages make it visible
    data = [episode_datum(e, 1.0 if i % 2 else -1.0) for i, e in enumerate(episodes)]
    out = training.forward_backward(data, 'importance_sampling').result()
    assert math.isfinite(out.metrics['loss:sum'])
    for e, o in zip(episodes, out.loss_fn_outputs):  # same weights: the learner's log-probs are the sampler's
        learner = o['logprobs'].to_numpy()[np.array(e['labels'][1:]) != IGNORE_INDEX]
        np.testing.assert_allclose(learner, e['logprobs'], atol=1e-3)
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()

    prompt = types.ModelInput.from_ints(episodes[0]['input_ids'])
    before = client.client.compute_logprobs(prompt).result()
    after = training.save_weights_and_get_sampling_client().result().compute_logprobs(prompt).result()
    assert not np.allclose(np.array(before[1:]), np.array(after[1:]), atol=1e-4)


@pytest.mark.slow
def test_the_example_runs_against_its_own_local_server():
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / 'examples' / 'agentic_tinker.py'
    args = ['--warmup-steps', '2', '--steps', '2', '--prompts-per-step', '2', '--group-size', '2']
    done = subprocess.run([sys.executable, str(example), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'warm-start 1:' in done.stdout and 'GRPO 1: reward' in done.stdout
