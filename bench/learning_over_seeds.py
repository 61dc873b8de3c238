"""Learning evidence over seeds for the learning examples (docs/contributing.md, "Time budget").

The CI suite checks each learning example once, on one seed and as few steps as show the effect, or (the tool loop,
whose learning takes ~5 minutes) only its mechanics; this script runs the full-length claims over several seeds, as the
examples' docstrings state them, and prints one row per run and the mean over the seeds. Run it when an area it covers
changes (the agentic rollout, the tools, the RL losses, the samplers) and record the table in docs/benchmarks.md.

    python bench/learning_over_seeds.py                       # every run below (about 35 minutes on 2 idle cores)
    python bench/learning_over_seeds.py --only tool --seeds 0 1

Runs (each example's defaults unless named):
- ``hint``:  examples/agentic_grpo.py, synchronous, 100 steps: `hint_use` of the last tenth, reward first/last tenth.
- ``async``: examples/agentic_grpo.py, ``max_staleness=1``, 30 steps: reward rise (mean of the last 10 steps minus
  the first 5).
- ``tool``:  examples/tool_grpo.py, 16 steps: reward and `tool_use` rise (last 4 steps minus the first 3).
- ``grpo``:  examples/grpo.py: reward of the second half over the first half.
- ``grpo-vllm``: the same with the vLLM sampler.
- ``ppo``:   examples/ppo.py (60 steps, a critic + GAE): reward and the critic's explained variance, first and last
  fifth.
- ``reward-model``: examples/reward_model.py: held-out ranking accuracy of the reward model, then the GRPO run
  against it: its judged reward and the exact accuracy it never sees, first and second half.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import fmean
from types import ModuleType
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[1] / 'examples'


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f'twinkle_example_{name}', EXAMPLES / f'{name}.py')
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hint(seed: int) -> dict[str, float]:
    r = example('agentic_grpo').main(seed=seed)
    return {'reward_first': r['first_reward'], 'reward_last': r['last_reward'], 'hint_use_last': r['hint_use_last']}


def async_hint(seed: int) -> dict[str, float]:
    r = example('agentic_grpo').main(steps=30, max_staleness=1, seed=seed)
    rewards = r['mean_rewards']
    return {'reward_first5': fmean(rewards[:5]), 'reward_last10': fmean(rewards[-10:])}


def tool(seed: int) -> dict[str, float]:
    r = example('tool_grpo').main(steps=16, seed=seed)
    rewards, uses = r['mean_rewards'], r['tool_uses']
    return {
        'reward_first3': fmean(rewards[:3]),
        'reward_last4': fmean(rewards[-4:]),
        'tool_use_first3': fmean(uses[:3]),
        'tool_use_last4': fmean(uses[-4:]),
    }


def grpo(seed: int, sampler_name: str = 'TorchSampler') -> dict[str, float]:
    rewards = example('grpo').main(seed=seed, sampler_name=sampler_name)['mean_rewards']
    half = len(rewards) // 2
    return {'reward_first_half': fmean(rewards[:half]), 'reward_second_half': fmean(rewards[half:])}


def grpo_vllm(seed: int) -> dict[str, float]:
    return grpo(seed, 'vLLMSampler')


def ppo(seed: int) -> dict[str, float]:
    r = example('ppo').main(seed=seed)
    return {k: r[k] for k in ('reward_first', 'reward_last', 'explained_variance_first', 'explained_variance_last')}


def reward_model(seed: int) -> dict[str, float]:
    r = example('reward_model').main(seed=seed)
    half = len(r['grpo']['mean_rewards']) // 2
    judged, exact = r['grpo']['mean_rewards'], r['grpo']['accuracies']
    return {
        'ranking_accuracy': r['accuracy_after'],
        'judged_first_half': fmean(judged[:half]),
        'judged_second_half': fmean(judged[half:]),
        'exact_first_half': fmean(exact[:half]),
        'exact_second_half': fmean(exact[half:]),
    }


RUNS: dict[str, Callable[[int], dict[str, float]]] = {
    'hint': hint,
    'async': async_hint,
    'tool': tool,
    'grpo': grpo,
    'grpo-vllm': grpo_vllm,
    'ppo': ppo,
    'reward-model': reward_model,
}


def main(only: list[str], seeds: list[int]) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {}
    for name in only:
        for seed in seeds:
            start = time.perf_counter()
            row = RUNS[name](seed)
            row['minutes'] = (time.perf_counter() - start) / 60
            results.setdefault(name, []).append({'seed': seed, **row})
            print(f'[{name}] seed {seed}: ' + ', '.join(f'{k} {v:.3f}' for k, v in row.items()), flush=True)
    print('\n| run | seed | measures |\n| --- | --- | --- |')
    for name, rows in results.items():
        for row in rows:
            cells = ', '.join(f'{k} {v:.2f}' for k, v in row.items() if k != 'seed')
            print(f'| {name} | {row["seed"]} | {cells} |')
        keys = [k for k in rows[0] if k not in ('seed', 'minutes')]
        print(f'| {name} | mean | ' + ', '.join(f'{k} {fmean(r[k] for r in rows):.2f}' for k in keys) + ' |')
    return results


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--only', nargs='+', choices=sorted(RUNS), default=list(RUNS))
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1])
    args = parser.parse_args()
    sys.exit(0 if main(args.only, args.seeds) else 1)
