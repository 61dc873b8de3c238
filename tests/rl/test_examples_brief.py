"""RL examples end to end in a few steps (their learning claims are `test_examples.py`'s, slow):

- examples/ppo.py: the reference KL is exactly 0 while the policy still is the reference and moves once it
  trains; the critic's metrics are reported every step; several PPO epochs per batch work (the critic's learning
  is `tests/transformers/test_value_model.py`; PPO's learning on a real model is in docs/benchmarks.md);
- examples/grpo.py --dynamic-sampling: every trained group is informative (DAPO)."""

from __future__ import annotations

import math

import pytest

from tests.rl.test_examples import load_example


def test_ppo_example_runs_with_a_kl_penalty_to_the_warm_started_policy(tmp_path):
    result = load_example('ppo').main(
        steps=3, prompts_per_step=4, samples_per_prompt=2, warmup_steps=3, kl_coef=0.05, work_dir=str(tmp_path)
    )
    history = result['history']
    assert all(len(values) == 3 for values in history.values()), history
    assert history['kl'][0] == pytest.approx(0.0, abs=1e-6)  # step 0 samples the reference itself
    assert any(abs(k) > 1e-6 for k in history['kl'][1:])  # the policy has moved since
    assert all(math.isfinite(v) for v in history['value_loss'])


def test_grpo_dynamic_sampling_trains_only_informative_groups():
    result = load_example('grpo').main(steps=3, warmup_steps=10, prompts_per_step=4, dynamic_sampling=True)
    # a kept group of 8 has at least one right answer: every step's mean reward is >= 1/8 (at chance ~0.1 a plain
    # batch often is not), and some drawn groups were dropped
    assert min(result['mean_rewards']) >= 1 / 8, result['mean_rewards']
    assert all(0 < f <= 1 for f in result['kept_fractions']) and min(result['kept_fractions']) < 1, result
