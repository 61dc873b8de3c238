"""MultiTurnRollout with the real samplers playing (the tiny model's own tokens, not a script): TorchSampler and
vLLMSampler, one batched call per turn, token accounting, and batched = one-at-a-time under greedy sampling."""

from __future__ import annotations

from typing import Any

import pytest

from twinkle_agentic.envs import GuessNumberEnv
from twinkle_agentic.rollout import MultiTurnRollout
from twinkle_core.types import IGNORE_INDEX

pytestmark = pytest.mark.usefixtures('tiny_model_dir')


class CountingSampler:
    """Passes calls through to `sampler`, recording each call's batch size."""

    def __init__(self, sampler: Any) -> None:
        self.sampler, self.calls = sampler, []

    def sample(self, prompts, params, **kwargs):
        self.calls.append(len(prompts))
        return self.sampler.sample(prompts, params, **kwargs)


class PlainGuessNumber(GuessNumberEnv):
    """Guess the number by plain-text replies only: no tool schema in the prompt (the session's vLLM engine holds
    256 tokens)."""

    def tools(self) -> list:
        return []

    def rules(self) -> str:
        return f'Guess my number ({self.low}-{self.high}).'


def games(n: int) -> list[dict]:
    return [{'messages': [{'role': 'system', 'content': 'Play.'}], 'user_data': {'secret': 10 + i}} for i in range(n)]


def rollout_for(sampler: Any, template: Any, **params: Any) -> MultiTurnRollout:
    """Greedy guess-the-number games. A greedy random model repeats one token and never ends its turn, so most of
    the vocabulary (all ids but every 4th) also ends one: short turns, and games that go on over several turns."""
    stop = [i for i in range(3, len(template.tokenizer)) if i % 4]
    sampling = {'max_tokens': 12, 'temperature': 0.0, 'stop': stop, **params}
    return MultiTurnRollout(
        sampler,
        template,
        env=PlainGuessNumber,
        env_kwargs={'max_guesses': 3},
        sampling_params=sampling,
        max_turns=3,
        max_trajectory_tokens=250,
    )


def check_accounting(episodes: list[dict]) -> None:
    for e in episodes:
        assert len(e['input_ids']) == len(e['labels']) <= 250
        trained = [t for t, label in zip(e['input_ids'], e['labels']) if label != IGNORE_INDEX]
        assert trained == [label for label in e['labels'] if label != IGNORE_INDEX]
        assert len(e['logprobs']) == len(trained) > 0
        assert all(lp <= 0.0 for lp in e['logprobs'])
        assert e['turns'] == sum(m['role'] == 'assistant' for m in e['messages'])


@pytest.mark.parametrize('which', ['torch', pytest.param('vllm', marks=pytest.mark.slow)])
def test_batched_rollout_equals_one_at_a_time_with_greedy_sampling(which, request, template):
    sampler = request.getfixturevalue('torch_sampler' if which == 'torch' else 'vllm_sampler')
    counting = CountingSampler(sampler)
    batched = rollout_for(counting, template)(games(6))
    assert 1 <= len(counting.calls) <= 3 and counting.calls[0] == 6  # one call per turn, all episodes at once
    assert max(e['turns'] for e in batched) >= 2  # the games go on after a wrong or unparseable guess
    check_accounting(batched)
    single = [rollout_for(sampler, template)([g])[0] for g in games(6)]
    assert [e['input_ids'] for e in single] == [e['input_ids'] for e in batched]
    assert [e['stop_reason'] for e in single] == [e['stop_reason'] for e in batched]
    for one, many in zip(single, batched):
        assert one['logprobs'] == pytest.approx(many['logprobs'], abs=1e-3)


def test_vllm_logprobs_are_the_training_models(vllm_sampler, template, tiny_model_dir):
    """vLLM's behaviour log-probs of an episode's sampled tokens match the training model's scores (fp32 fixture,
    different kernels: 1e-3)."""
    from twinkle_transformers.model import TransformersModel

    (episode,) = rollout_for(vllm_sampler, template, temperature=1.0, seed=3)(games(1))
    model = TransformersModel(str(tiny_model_dir))
    scored = model.forward_only(inputs=[{'input_ids': episode['input_ids']}], compute_loss=False)['logprobs'][0]
    trained = [lp for lp, label in zip(scored, episode['labels']) if label != IGNORE_INDEX]
    assert trained == pytest.approx(episode['logprobs'], abs=1e-3)
