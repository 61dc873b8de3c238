"""examples/agentic_grpo.py: the multi-turn GRPO loop runs end to end on the tiny fixture (rollout, masked rows,
GRPO step), its hint-use metric scores guesses against the hints, and an asynchronous run's reward rises (slow)."""

from __future__ import annotations

from statistics import fmean

import pytest

from tests.rl.test_examples import load_example

pytestmark = pytest.mark.usefixtures('tiny_model_dir')


def episode(secret: int, *guesses: str) -> dict:
    messages = [{'role': 'user', 'content': 'rules'}]
    for g in guesses:
        messages += [{'role': 'assistant', 'content': g}, {'role': 'user', 'content': 'hint'}]
    return {'user_data': {'secret': secret}, 'messages': messages}


def test_hint_use_scores_later_guesses_against_the_hints():
    hint_use = load_example('agentic_grpo').hint_use
    assert hint_use(episode(5, '4', '6', '5'), 8) == 1.0  # 4 low -> 6 in (4, 9); 6 high -> 5 in (4, 6)
    assert hint_use(episode(5, '4', '3', 'x'), 8) == 0.0  # 3 ignores "4 is too low"; 'x' is no number
    assert hint_use(episode(5, '5'), 8) is None  # right at once: nothing to score


@pytest.mark.slow
def test_the_loop_runs_and_trains(capsys):
    result = load_example('agentic_grpo').main(steps=2, prompts_per_step=2, group_size=4, warmup_steps=2, seed=0)
    assert len(result['mean_rewards']) == 2 and all(0.0 <= r <= 1.0 for r in result['mean_rewards'])
    assert 'a last game: assistant:' in capsys.readouterr().out


@pytest.mark.slow
def test_an_asynchronous_run_raises_the_reward(capsys):
    # max_staleness=1: the sampler plays step s+1's games while the trainer trains step s; measured on the idle
    # 2-core machine (seed 0, 30 steps): the reward rises from about 0.53 to about 0.65
    result = load_example('agentic_grpo').main(steps=30, max_staleness=1, seed=0)
    report = result['report']
    assert all(max(r.staleness) <= 1 for r in report.steps) and max(report.steps[-1].staleness) == 1
    first, last = fmean(result['mean_rewards'][:5]), fmean(result['mean_rewards'][-10:])
    assert last > first + 0.05, result['mean_rewards']
