"""tinker-cookbook environments played locally by `CookbookRollout`: the cookbook's own guess-the-number recipe, a
prefix-extending env (one trainable row per episode, token-exact), group rewards, stop reasons and limits."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import pytest
from scripted_policy import ScriptedSampler, trainable_runs

from twinkle_agentic.rollout import CookbookRollout
from twinkle_core.types import IGNORE_INDEX

pytest.importorskip('tinker_cookbook')
pytestmark = pytest.mark.usefixtures('tiny_model_dir')

from tinker_cookbook.recipes.multiplayer_rl.guess_number.env import GuessNumberEnvGroupBuilder  # noqa: E402
from tinker_cookbook.renderers import get_renderer  # noqa: E402
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, StepResult  # noqa: E402


@pytest.fixture(scope='module')
def renderer(torch_sampler):
    return get_renderer('qwen3', torch_sampler.tokenizer)


def bisect_guess(text: str) -> str:
    """The recipe's format (``Guess: n``), bisecting 0..1024 on the hints seen so far."""
    low, high = 0, 1024
    for guess, hint in re.findall(r'Guess: (\d+)<\|im_end\|>\n<\|im_start\|>user\n(Too low|Too high)', text):
        if hint == 'Too low':
            low = int(guess) + 1
        else:
            high = int(guess) - 1
    return f'Guess: {(low + high) // 2}'


def test_cookbook_guess_number_recipe_runs_locally(torch_sampler, renderer):
    """The recipe's env, unchanged: one batched sample per turn, the recipe's rewards; its ``player`` turns are
    re-rendered, so (as in the cookbook's own data path) each turn starts a new trainable row."""
    policy = ScriptedSampler(torch_sampler, torch_sampler.tokenizer, bisect_guess)
    builders = [GuessNumberEnvGroupBuilder(answer=a, renderer=renderer, num_envs=2) for a in (512, 255)]
    episodes = CookbookRollout(policy, sampling_params={'max_tokens': 16})(builders)
    assert [e['group'] for e in episodes] == [0, 0, 1, 1]
    assert [e['reward'] for e in episodes] == [1.0, 1.0, 1.0, 1.0]
    assert [e['turns'] for e in episodes] == [1, 1, 2, 2]  # 512 | 512 255
    assert policy.calls == [4, 2]  # finished episodes leave the batch
    assert [e['stop_reason'] for e in episodes] == ['stop'] * 4 and not any(e['truncated'] for e in episodes)
    assert [len(e['rows']) for e in episodes] == [1, 1, 2, 2]
    for e in episodes:
        for row in e['rows']:
            (run,) = trainable_runs(row)
            assert run[-1] == torch_sampler.tokenizer.eos_token_id and len(row['logprobs']) == len(run)
        assert len(e['trajectory'].transitions) == e['turns']


class CountEnv(Env):
    """Say the next number: a conversation that only grows (one row). Reward 1 per right number; done at `n`."""

    def __init__(self, renderer, n: int = 3) -> None:
        self.renderer, self.n, self.messages = renderer, n, [{'role': 'user', 'content': 'Count from 1.'}]

    async def initial_observation(self):
        return self.renderer.build_generation_prompt(self.messages), self.renderer.get_stop_sequences()

    async def step(self, action, *, extra=None) -> StepResult:
        message, _ = self.renderer.parse_response(action)
        self.messages += [message, {'role': 'user', 'content': 'next'}]
        said = len(self.messages) // 2
        reward = 1.0 if message['content'].strip() == str(said) else 0.0
        done = said >= self.n
        metrics = {'stop/completed': 1.0} if done else {}
        obs = self.renderer.build_generation_prompt(self.messages)
        return StepResult(reward, done, obs, self.renderer.get_stop_sequences(), metrics, {'said': message['content']})


@dataclass(frozen=True)
class CountGroup(EnvGroupBuilder):
    renderer: object
    size: int

    async def make_envs(self) -> Sequence[Env]:
        return [CountEnv(self.renderer) for _ in range(self.size)]

    async def compute_group_rewards(self, trajectory_group, env_group):
        return [(10.0 * i, {'rank': i}) for i in range(len(trajectory_group))]


def count(text: str) -> str:
    return str(text.count('<|im_start|>assistant\n'))


def test_growing_conversation_is_one_token_exact_row(torch_sampler, renderer, tiny_model_dir):
    policy = ScriptedSampler(torch_sampler, torch_sampler.tokenizer, count)
    (a, b) = CookbookRollout(policy, sampling_params={'max_tokens': 8})([CountGroup(renderer, 2)])
    assert a['turns'] == b['turns'] == 3 and a['stop_reason'] == 'completed'
    assert (a['reward'], b['reward']) == (3.0, 13.0)  # step rewards + the group's reward
    assert a['metrics']['rank'] == 0 and b['metrics']['rank'] == 1
    assert [log['said'] for log in a['logs']] == ['1', '2', '3']
    assert len(a['rows']) == 1 and a['input_ids'] == a['rows'][0]['input_ids']
    tok = torch_sampler.tokenizer
    runs = trainable_runs(a)
    assert [tok.decode(r) for r in runs] == ['1<|im_end|>', '2<|im_end|>', '3<|im_end|>']
    assert tok.decode(a['input_ids']).count('<|im_start|>user\nnext') == 2  # inserted, label -100
    # the behaviour log-probs are the training model's
    from twinkle_transformers.model import TransformersModel

    model = TransformersModel(str(tiny_model_dir))
    scored = model.forward_only(inputs=[{'input_ids': a['input_ids']}], compute_loss=False)['logprobs'][0]
    trained = [lp for lp, label in zip(scored, a['labels']) if label != IGNORE_INDEX]
    assert trained == pytest.approx(a['logprobs'], abs=1e-4)


def test_limits_cut_episodes(torch_sampler, renderer):
    policy = ScriptedSampler(torch_sampler, torch_sampler.tokenizer, lambda text: 'Guess: 1')
    (e,) = CookbookRollout(policy, max_turns=2)([GuessNumberEnvGroupBuilder(answer=900, renderer=renderer, num_envs=1)])
    assert (e['turns'], e['stop_reason'], e['truncated'], e['reward']) == (2, 'max_turns', True, 0.0)
    (e,) = CookbookRollout(policy, max_trajectory_tokens=100)([CountEnv(renderer, n=50)])
    assert e['stop_reason'] == 'context_overflow' and len(e['input_ids']) <= 100 and e['group'] == -1


def test_random_policy_runs_with_the_real_sampler(torch_sampler, renderer):
    """The tiny model itself (random weights) plays: turns end at the renderer's stop token or at max_tokens."""
    rollout = CookbookRollout(torch_sampler, sampling_params={'max_tokens': 6, 'temperature': 1.0, 'seed': 0})
    episodes = rollout([GuessNumberEnvGroupBuilder(answer=3, renderer=renderer, num_envs=3)])
    for e in episodes:
        assert e['turns'] == 10 and e['stop_reason'] == 'stop'  # the recipe's own turn cap ends it
        assert sum(len(r['logprobs']) for r in e['rows']) == sum(len(t.ac.tokens) for t in e['trajectory'].transitions)
        assert e['reward'] == pytest.approx(-10.0)  # unparseable guesses: the recipe's format penalty each turn


def test_bad_arguments_are_refused(torch_sampler):
    from twinkle_core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match='num_samples'):
        CookbookRollout(torch_sampler, sampling_params={'num_samples': 2})
    with pytest.raises(InvalidInputError, match='max_turns'):
        CookbookRollout(torch_sampler, max_turns=0)
