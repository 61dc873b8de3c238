"""Asynchronous vs synchronous GRPO: wall time for the same number of trained samples, and the reward reached.

The task is the "repeat d" task (twinkle_core/fixtures/repeat_task.py) with answers of `--repeats` tokens, on the
tiny fixture model after an SFT warm-start whose answers are right half the time (``--hint 0.5``; done once per
seed and saved, so both runs of a seed start from the same weights): GRPO then raises the reward from about 0.5
towards 1 within the run, so the two modes' learning can be compared. Each run is `AsyncRLDriver` with a
`TorchSampler` of its own, the trainer in this process with one torch thread; the sampler either in this process on
the rollout thread (``--layout thread``: the two threads share the GIL for their Python work) or in a one-CPU Ray
actor (``--layout ray``: two processes, one core each on a 2-core machine):

- synchronous: ``max_staleness=0`` -- the sampler waits for every update and the trainer for every batch, so one
  core is idle at any time (this is exactly the synchronous loop: tests/rl/test_async_driver.py);
- asynchronous: ``max_staleness=1`` (``--max-staleness``): the sampler makes step s+1's groups while the trainer
  trains step s; the GRPO loss's clipped importance ratio against the sampler's log-probs corrects for the lag.

Prints, per seed and in the mean: the wall time of each run's RL loop (`AsyncRLDriver.run`: the first weight load,
every sample call and training step; without building the model and starting the sampler, the same in both modes
and printed as "with set-up"), the ratio synchronous / asynchronous of the loops, the mean reward over all steps
(how fast it learnt) and over the last third (where it got to), the staleness, how busy each side was (the
per-stage timeline) and the off-policy statistics (IS ratio distribution, clipped fraction). `--json PATH` writes
the results.

Run: .venv/bin/python bench/async_rl.py [--layout thread|ray] [--seeds 0 1 2] [--steps 40] [--repeats 32]
                                      [--hint 0.5] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from statistics import fmean
from typing import Any

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')


def warm_start(seed: int, repeats: int, steps: int, hint: float, out_dir: str) -> str:
    """The warm-start of `seed` (its answers right with probability `hint`, else a random digit), saved; returns
    the model directory."""
    from twinkle_core.fixtures.repeat_task import format_warmup
    from twinkle_core.fixtures.tiny_model import ensure_tiny_model
    from twinkle_core.model import TransformersModel
    from twinkle_core.registry import resolve

    model = TransformersModel(model_id=ensure_tiny_model('tiny'))
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)
    format_warmup(model, template, random.Random(seed), steps, hint=hint, repeats=repeats)
    return model.save(f'warm_seed{seed}', output_dir=out_dir)


def run(model_dir: str, args: argparse.Namespace, seed: int, max_staleness: int) -> dict[str, Any]:
    """One GRPO run with the driver; returns its wall time, rewards and timeline summary."""
    from twinkle_core.advantage import GRPOAdvantage
    from twinkle_core.fixtures.repeat_task import RepeatTaskWorker
    from twinkle_core.model import TransformersModel
    from twinkle_core.registry import resolve, resolve_class
    from twinkle_core.rl import AsyncRLDriver, PolicyGradientStep

    model = TransformersModel(model_id=model_dir)
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)
    model.set_optimizer('AdamW', lr=args.lr)
    model.set_loss('GRPOLoss', epsilon=0.2, epsilon_high=0.28)

    def new_worker() -> RepeatTaskWorker:
        remote = {'remote_group': 'sampler'} if args.layout == 'ray' else {}
        if remote:
            from twinkle_core.runtime.context import current_runtime

            current_runtime().reset_group('sampler')  # a fresh actor per run
        sampler = resolve_class('sampler', 'TorchSampler')(model_id=model_dir, **remote)
        return RepeatTaskWorker(
            sampler,
            template,
            prompts_per_call=args.prompts,
            group_size=args.group_size,
            seed=seed,
            repeats=args.repeats,
        )

    train_step = PolicyGradientStep(model, GRPOAdvantage(scale='group'), max_norm=1.0)
    driver = AsyncRLDriver(model, new_worker, train_step, groups_per_step=args.prompts, max_staleness=max_staleness)
    try:
        report = driver.run(args.steps)
    finally:
        driver.close()
    rewards = [r.metrics['reward'] for r in report.steps]
    tail = max(1, len(rewards) // 3)
    return {
        **report.summary(),
        'final_reward': fmean(rewards[-tail:]),
        'mean_reward': fmean(rewards),
        'rewards': rewards,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--prompts', type=int, default=8, help='prompts (groups) per step')
    parser.add_argument('--group-size', type=int, default=4)
    parser.add_argument('--repeats', type=int, default=32, help='answer length in tokens')
    parser.add_argument('--warmup-steps', type=int, default=100)
    parser.add_argument('--hint', type=float, default=0.5, help='warm-start answers right with this probability')
    parser.add_argument('--lr', type=float, default=5e-4)
    parser.add_argument('--max-staleness', type=int, default=1)
    parser.add_argument('--threads', type=int, default=1, help='torch threads (each side runs its ops in its thread)')
    parser.add_argument('--layout', choices=['thread', 'ray'], default='thread', help='where the sampler runs')
    parser.add_argument('--json', default=None)
    args = parser.parse_args()

    import torch

    from twinkle_core.rl import off_policy_line

    torch.set_num_threads(args.threads)
    if args.layout == 'ray':
        import ray

        import twinkle_core
        from twinkle_core.mesh import DeviceGroup

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        twinkle_core.initialize(
            mode='ray', groups=[DeviceGroup(name='sampler', ranks=1, options={'num_cpus': 1, 'env': _one_thread()})]
        )
    results: dict[str, Any] = {'args': vars(args), 'seeds': {}}
    with tempfile.TemporaryDirectory() as out_dir:
        for seed in args.seeds:
            model_dir = warm_start(seed, args.repeats, args.warmup_steps, args.hint, out_dir)
            per_mode = {}
            for name, staleness in (('sync', 0), ('async', args.max_staleness)):
                started = time.perf_counter()
                per_mode[name] = run(model_dir, args, seed, staleness)
                per_mode[name]['total_s'] = time.perf_counter() - started  # with the model's and sampler's set-up
            per_mode['ratio'] = per_mode['sync']['wall_s'] / per_mode['async']['wall_s']
            results['seeds'][seed] = per_mode
            for name in ('sync', 'async'):
                r = per_mode[name]
                print(
                    f'seed {seed} {name:5s}: {r["wall_s"]:6.1f} s (with set-up {r["total_s"]:.1f} s)  reward mean '
                    f'{r["mean_reward"]:.3f} final {r["final_reward"]:.3f}  staleness {r["staleness_mean"]:.2f}  '
                    f'sampler busy {r["rollout_busy"]:.0%}  trainer busy {r["trainer_busy"]:.0%}'
                )
                print(f'             {off_policy_line(r)}')
            print(f'seed {seed}: synchronous / asynchronous wall time = {per_mode["ratio"]:.2f}x')
    ratios = [results['seeds'][s]['ratio'] for s in args.seeds]
    results['ratio_mean'] = fmean(ratios)
    print(f'mean over {len(ratios)} seeds: {fmean(ratios):.2f}x faster asynchronously')
    for key in ('mean_reward', 'final_reward'):
        per_mode = {m: [results['seeds'][s][m][key] for s in args.seeds] for m in ('sync', 'async')}
        print(
            f'{key}: sync {fmean(per_mode["sync"]):.3f} ({", ".join(f"{v:.3f}" for v in per_mode["sync"])}) vs async '
            f'{fmean(per_mode["async"]):.3f} ({", ".join(f"{v:.3f}" for v in per_mode["async"])})'
        )
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(results, f, indent=1)


def _one_thread() -> dict[str, str]:
    return {'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}


if __name__ == '__main__':
    main()
