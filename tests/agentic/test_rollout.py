"""MultiTurnRollout on the tiny fixture: token-exact turns (sampled tokens verbatim, inserted tokens masked),
log-probs that the training model reproduces, batching (one sample call per turn), stop reasons, env and tools."""

from __future__ import annotations

import re

import pytest
from scripted_policy import ScriptedSampler, trainable_runs

from twinkle_agentic.rollout import MultiTurnRollout
from twinkle_core.env import Env, StepResult
from twinkle_core.types import IGNORE_INDEX

pytestmark = pytest.mark.usefixtures('tiny_model_dir')


GUESS_AND_HINT = re.compile(r'"number": (\d+)\}\}\n</tool_call>.*?<tool_response>\n(.*?)\n</tool_response>', re.S)


def binary_search(text: str) -> str:
    """Guess-number policy: bisect on the hints seen so far (the env says too low / too high)."""
    low, high = 1, 100
    for guess, hint in re.findall(
        r'"number": (\d+)\}\}\n</tool_call>.*?<tool_response>\n(.*?)\n</tool_response>', text, re.S
    ):
        if 'too low' in hint:
            low = int(guess) + 1
        elif 'too high' in hint:
            high = int(guess) - 1
    return f'<tool_call>\n{{"name": "guess", "arguments": {{"number": {(low + high) // 2}}}}}\n</tool_call>'


def games(secrets: list[int]) -> list[dict]:
    return [
        {'messages': [{'role': 'user', 'content': 'Guess my number.'}], 'user_data': {'secret': s}} for s in secrets
    ]


def turn_starts(episode: dict) -> list[int]:
    labels = episode['labels']
    return [i for i in range(len(labels)) if labels[i] != IGNORE_INDEX and (i == 0 or labels[i - 1] == IGNORE_INDEX)]


def test_guess_number_episodes_are_token_exact_and_batched(torch_sampler, template, tmp_path):
    tokenizer = template.tokenizer
    policy = ScriptedSampler(torch_sampler, tokenizer, binary_search)
    rollout = MultiTurnRollout(
        policy, template, env='GuessNumberEnv', max_turns=8, sampling_params={'max_tokens': 64}, trace_dir=tmp_path
    )
    episodes = rollout(games([50, 73, 1]))
    assert [e['stop_reason'] for e in episodes] == ['stop', 'stop', 'stop']
    assert [e['reward'] for e in episodes] == [1.0, 1.0, 1.0]
    assert [e['turns'] for e in episodes] == [1, 6, 6]  # bisection: 50 | 50 75 62 68 71 73 | 50 25 12 6 3 1
    assert policy.calls == [3, 2, 2, 2, 2, 2]  # one batched call per turn; finished episodes leave the batch
    for e in episodes:
        turns = trainable_runs(e)
        assert len(turns) == e['turns'] and len(e['labels']) == len(e['input_ids'])
        for start, turn in zip(turn_starts(e), turns):  # each sampled turn verbatim: what the policy sent
            reply = binary_search(tokenizer.decode(e['input_ids'][:start]))
            assert turn == tokenizer(reply, add_special_tokens=False)['input_ids'] + [tokenizer.eos_token_id]
        assert len(e['logprobs']) == sum(len(t) for t in turns)
        assert tokenizer.decode(e['input_ids']).count('<tool_response>') == e['turns'] - 1  # inserted, label -100
        assert [m['role'] for m in e['messages']] == ['user'] + ['assistant', 'tool'] * (e['turns'] - 1) + ['assistant']
    assert len(list(tmp_path.glob('episode_*.jsonl'))) == 3


def test_episode_logprobs_are_the_training_models(torch_sampler, template, tiny_model_dir):
    """The behaviour log-probs line up with the trainable labels: the model scores them the same (fp32)."""
    from twinkle_transformers.model import TransformersModel

    rollout = MultiTurnRollout(
        ScriptedSampler(torch_sampler, template.tokenizer, binary_search), template, env='GuessNumberEnv'
    )
    (episode,) = rollout(games([73]))
    model = TransformersModel(tiny_model_dir)
    scored = model.forward_only(inputs=[{'input_ids': episode['input_ids']}], compute_loss=False)['logprobs'][0]
    trained = [lp for lp, label in zip(scored, episode['labels']) if label != IGNORE_INDEX]
    assert trained == pytest.approx(episode['logprobs'], abs=1e-4)
    model.set_loss('GRPOLoss')
    out = model.forward_backward(inputs=[episode], old_logps=[episode['logprobs']], advantages=[1.0])
    assert out['loss'] == pytest.approx(-1.0, abs=1e-3)  # on-policy: ratio 1, advantage 1


def test_stop_reasons(torch_sampler, template):
    tokenizer = template.tokenizer
    chatty = ScriptedSampler(torch_sampler, tokenizer, lambda text: 'plain answer')
    (done,) = MultiTurnRollout(chatty, template)(games([5]))
    assert done['stop_reason'] == 'stop' and done['turns'] == 1 and not done['truncated']
    (cut,) = MultiTurnRollout(chatty, template, sampling_params={'max_tokens': 1})(games([5]))
    assert cut['stop_reason'] == 'length' and cut['truncated']
    guessing = ScriptedSampler(torch_sampler, tokenizer, lambda text: binary_search(''))  # always 50
    (turns,) = MultiTurnRollout(guessing, template, env='GuessNumberEnv', max_turns=2)(games([99]))
    assert turns['stop_reason'] == 'max_turns' and turns['turns'] == 2
    (calls,) = MultiTurnRollout(guessing, template, env='GuessNumberEnv', max_tool_calls=1)(games([99]))
    assert calls['stop_reason'] == 'max_tool_calls' and calls['tool_calls'] == 1
    (free,) = MultiTurnRollout(guessing, template, env='GuessNumberEnv', max_turns=3)(games([99]))
    limit = turn_starts(free)[1] + 10  # the second turn's prompt fits, not the turn
    (room,) = MultiTurnRollout(guessing, template, env='GuessNumberEnv', max_trajectory_tokens=limit)(games([99]))
    assert room['stop_reason'] == 'context_overflow' and len(room['input_ids']) <= limit and room['turns'] == 2
    broken = ScriptedSampler(torch_sampler, tokenizer, lambda text: '<tool_call>\n{"name": \n</tool_call>')
    (parse,) = MultiTurnRollout(broken, template, env='GuessNumberEnv', max_turns=2)(games([5]))
    assert parse['stop_reason'] == 'max_turns' and 'not valid JSON' in parse['messages'][2]['content']
    (strict,) = MultiTurnRollout(broken, template, env='GuessNumberEnv', stop_on_parse_error=True)(games([5]))
    assert strict['stop_reason'] == 'parse_error'


class EchoEnv(Env):
    """A third-party env: rewards an answer that repeats the word in ``user_data['word']``."""

    def reset(self, trajectory: dict) -> str | None:
        self.word = trajectory['user_data']['word']
        return None

    def step(self, tool_name: str, arguments: dict) -> StepResult:
        return StepResult(observation='no tools here', done=True)

    def respond(self, text: str) -> StepResult:
        return StepResult(reward=float(text.strip() == self.word), done=True)


def test_a_third_party_env_by_name(torch_sampler, template, third_party_dist):
    third_party_dist('twinkle-tp-envs', 'twinkle.env', f'EchoEnv = {__name__}:EchoEnv')
    policy = ScriptedSampler(torch_sampler, template.tokenizer, lambda text: 'hello')
    prompts = [
        {'messages': [{'role': 'user', 'content': 'Say a word.'}], 'user_data': {'word': w}} for w in ('hello', 'bye')
    ]
    episodes = MultiTurnRollout(policy, template, env='EchoEnv')(prompts)
    assert [e['reward'] for e in episodes] == [1.0, 0.0] and {e['stop_reason'] for e in episodes} == {'stop'}
