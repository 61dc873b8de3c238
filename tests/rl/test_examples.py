"""The RL examples' claims, on CPU with the tiny fixture models (slow: a few minutes in all)."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from statistics import fmean
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / 'examples'


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f'twinkle_example_{name}', EXAMPLES / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_grpo_mean_reward_at_least_doubles():
    result = load_example('grpo').main(seed=0)  # seeds 1 and 2 clear 2x as well (docs/rl.md)
    assert result['last_reward'] >= 2 * result['first_reward'], result['mean_rewards']


@pytest.mark.slow
def test_grpo_with_the_vllm_sampler_learns_too():
    """The same loop sampling with vLLM (its own weights, synced before every step). vLLM draws other random
    numbers than TorchSampler, so the run differs; measured (seeded, reproducible): 0.095 -> 0.180 (1.9x)."""
    pytest.importorskip('vllm')
    result = load_example('grpo').main(seed=0, sampler_name='vLLMSampler')
    assert result['last_reward'] >= 1.5 * result['first_reward'], result['mean_rewards']


@pytest.mark.slow
def test_dpo_preference_margin_rises():
    result = load_example('dpo').main(steps=30)
    assert result['first_margin'] < 0.1 < result['last_margin'], result['margins']
    assert fmean(result['accuracies'][-5:]) > fmean(result['accuracies'][:5])


@pytest.mark.slow
@pytest.mark.parametrize('on_policy_fraction', [0.0, 1.0], ids=['off-policy', 'on-policy'])
def test_gkd_student_teacher_divergence_falls(on_policy_fraction):
    result = load_example('gkd').main(steps=30, teacher_steps=60, on_policy_fraction=on_policy_fraction)
    assert result['divergence_after'] < 0.7 * result['divergence_before'], result
