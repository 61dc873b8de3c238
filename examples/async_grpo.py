"""Asynchronous GRPO on CPU with the tiny fixture model: the "repeat d" task of examples/grpo.py, with sampling
and training overlapped by `AsyncRLDriver` (twinkle_core.rl).

A rollout thread samples the next groups with its own sampler (`TorchSampler(model_id=...)`, or vLLM) while the
trainer trains on the previous ones; after every optimizer step the trainer publishes its weights as the next
policy version, and the sampler loads the newest version between its sample calls. ``--max-staleness k`` bounds
how many steps a trained group may lag behind the trainer (0: exactly the synchronous loop); the GRPO loss's
clipped importance ratio against the sampler's log-probs (``old_logps``) corrects for the lag.

    python examples/async_grpo.py                     # max_staleness=1, a few minutes on 2 CPU cores
    python examples/async_grpo.py --max-staleness 0   # synchronous: sample, train, sync, sample...
    python examples/async_grpo.py --sampler vLLMSampler
    python examples/async_grpo.py --ray               # the sampler in a Ray actor group, the trainer here
    python examples/async_grpo.py --ray --ray-trainer # the trainer in a Ray actor group as well (the seeds' layout)
    python examples/async_grpo.py --eval-every 10     # greedy accuracy on held-out prompts as it trains

With ``--ray`` the sampler is a one-actor Ray group (`twinkle_core.initialize(mode='ray')`, ``remote_group=``):
sampling runs in that actor's process, training in this one, and the published weights travel to the actor
between its sample calls. With ``--ray-trainer`` as well, training runs in a one-actor training group and every
published version goes straight from the training actor to the sampler actor (the runtime's weight sync; the
sampler actor applies it between two of its calls). Without ``--ray`` both run in this process, on two threads.
"""

from __future__ import annotations

import argparse
import random
from statistics import fmean
from typing import Any

import twinkle_core
from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.eval import evaluate
from twinkle_core.fixtures.repeat_task import RepeatTask, RepeatTaskWorker, format_warmup
from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_core.mesh import DeviceGroup
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.rl import AsyncRLDriver, PolicyGradientStep, off_policy_line, run_with_progress
from twinkle_core.runtime.context import current_runtime


def main(
    steps: int = 60,
    prompts_per_step: int = 16,
    group_size: int = 8,
    prompts_per_call: int | None = None,
    max_staleness: int = 1,
    warmup_steps: int = 60,
    lr: float = 5e-4,
    temperature: float = 1.0,
    seed: int = 0,
    sampler_name: str = 'TorchSampler',
    model_id: str | None = None,
    ray: bool = False,
    ray_trainer: bool = False,
    eval_every: int = 0,
) -> dict[str, Any]:
    rng = random.Random(seed)
    if eval_every and ray_trainer:
        raise SystemExit("--eval-every samples the trainer's weights in this process; not with --ray-trainer")
    model_dir = model_id or str(ensure_tiny_model('tiny'))
    if ray:
        groups = [DeviceGroup(name='sampler', ranks=1, device_type='cpu')]
        groups += [DeviceGroup(name='model', ranks=1, device_type='cpu')] if ray_trainer else []
        twinkle_core.initialize(mode='ray', groups=groups)
    model = TransformersModel(model_id=model_dir, **({'remote_group': 'model'} if ray and ray_trainer else {}))
    template = resolve('template', 'Template', model_id_or_tokenizer=model_dir)
    format_warmup(model, template, rng, warmup_steps)
    model.set_optimizer('AdamW', lr=lr)
    model.set_loss('GRPOLoss', epsilon=0.2, epsilon_high=0.28)

    workers_built = 0

    def new_worker() -> RepeatTaskWorker:  # samples "repeat d" prompts, scores the answers (fixtures/repeat_task.py)
        nonlocal workers_built
        if ray and workers_built:  # rebuilt after a failure (e.g. its actor died): start the group's actor afresh
            current_runtime().reset_group('sampler')
        workers_built += 1
        sampler_cls = resolve_class('sampler', sampler_name)
        extra = {'engine_args': {'max_model_len': 256}} if sampler_name != 'TorchSampler' else {}
        if ray:
            extra['remote_group'] = 'sampler'
        sampler = sampler_cls(model_id=model_dir, **extra)  # its own weights: the driver keeps them fresh
        return RepeatTaskWorker(
            sampler,
            template,
            prompts_per_call=prompts_per_call or prompts_per_step,
            group_size=group_size,
            seed=seed,
            temperature=temperature,
        )

    # group-relative advantages, one per completion; each row's old_logps: the sampler's (behaviour) log-probs
    train_step = PolicyGradientStep(model, GRPOAdvantage(scale='group'), max_norm=1.0)
    driver = AsyncRLDriver(
        model,
        new_worker,
        train_step,
        groups_per_step=prompts_per_step,
        groups_per_call=prompts_per_call,
        max_staleness=max_staleness,
    )
    evaluator = held_out_evaluator(model, template, seed) if eval_every else None
    report = run_with_progress(
        driver, steps, desc=f'GRPO (max_staleness={max_staleness})', evaluator=evaluator, eval_every=eval_every
    )
    mean_rewards = [r.metrics['reward'] for r in report.steps]
    half = max(1, steps // 2)
    summary = report.summary()
    print(
        f'mean reward: first half {fmean(mean_rewards[:half]):.3f}, second half {fmean(mean_rewards[half:] or [0]):.3f}'
    )
    print(
        f'wall {summary["wall_s"]:.1f}s; staleness mean {summary["staleness_mean"]:.2f} max '
        f'{summary["staleness_max"]:.0f}; dropped {summary["dropped"]:.0f}; sampler busy '
        f'{summary["rollout_busy"]:.0%}, trainer busy {summary["trainer_busy"]:.0%}'
    )
    print(off_policy_line(summary))
    if report.evaluations:
        (first, before), (last, after) = report.evaluations[0], report.evaluations[-1]
        print(f'held-out greedy accuracy: version {first} {before["accuracy"]:.3f} -> {last} {after["accuracy"]:.3f}')
    return {
        'mean_rewards': mean_rewards,
        'report': report,
        'model': model,
        'sampler_version': driver.weights.sampler_version,
    }


def held_out_evaluator(model: Any, template: Any, seed: int) -> Any:
    """`evaluate(version)`: greedy accuracy on 50 "repeat d" prompts drawn apart from training's, sampled by a
    `TorchSampler` sharing the trainer's weights; the driver calls it on the trainer's thread between two steps
    (the rollout thread samples on), and the metrics reach every metrics logger at that policy version."""
    sampler = resolve_class('sampler', 'TorchSampler')(model=model)
    sampler.set_template(template)
    task = RepeatTask(size=50, seed=seed + 12345)
    return lambda version: evaluate(sampler, task, step=version, progress=False).metrics


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=60)
    parser.add_argument('--group-size', type=int, default=8)
    parser.add_argument('--prompts-per-step', type=int, default=16)
    parser.add_argument('--prompts-per-call', type=int, default=None, help='default: one call per step')
    parser.add_argument('--max-staleness', type=int, default=1)
    parser.add_argument('--warmup-steps', type=int, default=60)
    parser.add_argument('--lr', type=float, default=5e-4)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--sampler', default='TorchSampler', help='sampler by registry name, e.g. vLLMSampler')
    parser.add_argument('--ray', action='store_true', help='run the sampler in a Ray actor group')
    parser.add_argument('--ray-trainer', action='store_true', help='with --ray: the trainer in a Ray group too')
    parser.add_argument('--eval-every', type=int, default=0, help='held-out greedy accuracy every N steps (0: never)')
    args = parser.parse_args()
    main(
        steps=args.steps,
        group_size=args.group_size,
        prompts_per_step=args.prompts_per_step,
        prompts_per_call=args.prompts_per_call,
        max_staleness=args.max_staleness,
        warmup_steps=args.warmup_steps,
        lr=args.lr,
        seed=args.seed,
        sampler_name=args.sampler,
        ray=args.ray,
        ray_trainer=args.ray_trainer,
        eval_every=args.eval_every,
    )
