"""A Bradley-Terry reward model on the tiny fixture (examples/reward_model.py), served as `RewardModelReward`.

The toy task: for "repeat d" the chosen answer is d, the rejected one another digit; held-out pairs are draws of
their own."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from twinkle_core.errors import InvalidInputError
from twinkle_core.registry import resolve

EXAMPLE = Path(__file__).resolve().parents[2] / 'examples' / 'reward_model.py'


@pytest.fixture(scope='module')
def example():
    spec = importlib.util.spec_from_file_location('twinkle_example_reward_model', EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def trained(example, tmp_path_factory):
    return example.train_reward_model(steps=60, output_dir=str(tmp_path_factory.mktemp('rm')))


def test_the_reward_model_ranks_held_out_pairs(trained):
    assert trained['accuracy_before'] < 0.8 and trained['accuracy_after'] >= 0.9, trained


def conversation(prompt: dict, answer: str) -> dict:
    return {**prompt, 'messages': [*prompt['messages'], {'role': 'assistant', 'content': answer}]}


def test_reward_model_reward_scores_completions_like_the_model(example, trained):
    reward = resolve('reward', 'RewardModelReward', model=trained['checkpoint'], batch_size=7)
    pairs = example.repeat_pairs(random.Random(5), 40)
    trajectories = [conversation(p, answer) for p in pairs for answer in (p['chosen'], p['rejected'])]
    scores = reward(trajectories)
    right_above_wrong = sum(scores[i] > scores[i + 1] for i in range(0, len(scores), 2)) / len(pairs)
    assert right_above_wrong >= 0.9, scores
    # the same numbers as the model's own scores of the encoded conversations, batched differently
    rows = [{'input_ids': reward.template.encode(t)['input_ids']} for t in trajectories]
    assert scores == pytest.approx(reward.model.forward_only(inputs=rows, compute_loss=False)['scores'], abs=1e-5)
    shifted = resolve('reward', 'RewardModelReward', model=reward.model, template=reward.template, shift=1.0, scale=2.0)
    assert shifted(trajectories[:4]) == pytest.approx([2 * (s - 1) for s in scores[:4]], abs=1e-5)


def test_reward_model_reward_refuses_bad_input(trained):
    reward = resolve('reward', 'RewardModelReward', model=trained['checkpoint'])
    with pytest.raises(InvalidInputError, match="role 'user'.*assistant"):
        reward([{'messages': [{'role': 'user', 'content': 'repeat 3'}]}])
    with pytest.raises(InvalidInputError, match='give template='):
        resolve('reward', 'RewardModelReward', model=object())
    with pytest.raises(InvalidInputError, match='model built here'):
        resolve('reward', 'RewardModelReward', model=reward.model, checkpoint=trained['checkpoint'])
    policy = resolve('model', 'TransformersModel', model_id=reward.model.model_dir)
    with pytest.raises(InvalidInputError, match='returned no scores'):
        resolve('reward', 'RewardModelReward', model=policy)(
            [{'messages': [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': '3'}]}]
        )
