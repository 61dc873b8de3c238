"""GRPO on CPU with the tiny fixture model: "repeat 7" -> "7" (echo the prompt's digit) with a 0/1 reward.

The loop is the whole algorithm, top to bottom:

1. sample ``group_size`` completions per prompt -- `TorchSampler(model=model)` shares the training model's weights,
   so the weight sync before each step moves nothing; with ``--sampler vLLMSampler`` a vLLM engine holds its own
   copy and the same `CheckpointEngineManager.sync_weights()` call copies the updated policy into it;
2. score them (`MathAccuracyReward`: the completion's number equals the prompt's ``ground_truth``);
3. group-relative advantages (`GRPOAdvantage`), one per completion (the per-row field ``advantage``);
4. a `GRPOLoss` step on the (prompt + completion) rows, with the sampler's log-probs as ``old_logps``.

The fixture model starts from random weights, so a short SFT warm-start first teaches the answer *format* only:
its answers are random digits, unrelated to the prompt. That leaves a policy that answers one digit and stops but
guesses which one (about 10% of sampled answers right); everything above that is learnt from the reward alone.

    python examples/grpo.py                  # 2-3 minutes on one CPU core
    python examples/grpo.py --updates-per-batch 2   # later updates are off-policy: the ratio clip is active
    python examples/grpo.py --sampler vLLMSampler   # sample with vLLM (pip install twinkle-vllm)
    python examples/grpo.py --dynamic-sampling      # DAPO: drop groups whose rewards all agree, draw more
"""

from __future__ import annotations

import argparse
import random
from functools import partial
from itertools import count
from statistics import fmean
from typing import Any, Iterator

from tqdm import tqdm

from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.checkpoint_engine import CheckpointEngineManager
from twinkle_core.fixtures.repeat_task import completion_row, format_warmup, repeat_prompts
from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_core.metric import CompletionRewardMetric
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.reward import MathAccuracyReward
from twinkle_core.rl.dynamic_sampling import fill_informative_groups
from twinkle_core.rl.rollout_group import RolloutGroup, rows_with_advantages
from twinkle_core.types import SamplingParams


def sample_groups(
    sampler: Any, template: Any, reward_fn: Any, rng: random.Random, group_size: int, seeds: Iterator[int], n: int
) -> list[RolloutGroup]:
    """Sample and score `n` new prompts' groups of `group_size` completions (the sampling seed: next of `seeds`)."""
    prompts = repeat_prompts(rng, n)
    prompt_rows = [template.encode(p, add_generation_prompt=True) for p in prompts]
    # max_tokens=2: room for one digit + end of turn; longer answers are cut off
    params = SamplingParams(max_tokens=2, temperature=1.0, num_samples=group_size, seed=next(seeds))
    groups = []
    for prompt, prompt_row, response in zip(prompts, prompt_rows, sampler.sample(prompt_rows, params)):
        ids, seqs = prompt_row['input_ids'], response.sequences
        answers = [
            {**prompt, 'messages': [*prompt['messages'], {'role': 'assistant', 'content': s.text or ''}]} for s in seqs
        ]
        rows = [completion_row(ids, s.tokens, s.logprobs) for s in seqs]
        info = {'trajectories': answers, 'lengths': [len(s.tokens) for s in seqs]}
        groups.append(RolloutGroup(rows=rows, rewards=[0.0] * len(rows), info=info))
    rewards = reward_fn([t for g in groups for t in g.info['trajectories']])
    for i, group in enumerate(groups):
        group.rewards = rewards[i * group_size : (i + 1) * group_size]
    return groups


def main(
    steps: int = 100,
    prompts_per_step: int = 16,
    group_size: int = 8,
    warmup_steps: int = 60,
    warmup_hint: float = 0.0,
    lr: float = 5e-4,
    updates_per_batch: int = 1,
    loss_type: str = 'grpo',
    seed: int = 0,
    sampler_name: str = 'TorchSampler',
    reward_fn: Any = None,
    dynamic_sampling: bool = False,
) -> dict[str, Any]:
    """`reward_fn`: any `Reward` (default `MathAccuracyReward`, the task's exact reward; e.g. a trained reward model,
    examples/reward_model.py). ``accuracies``: the exact reward's mean per step, whatever the training reward.
    `dynamic_sampling`: DAPO's -- groups whose rewards all agree are dropped and more are drawn (at most 4 draws a
    step) until `prompts_per_step` groups are kept; ``kept_fractions`` says how many drawn groups were kept."""
    rng = random.Random(seed)
    model = TransformersModel(model_id=ensure_tiny_model('tiny'))
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)

    # ---- 1. warm-start on random answers: the format (one digit, end of turn), not the task -----------------
    format_warmup(model, template, rng, warmup_steps, hint=warmup_hint)

    # ---- 2. GRPO ------------------------------------------------------------------------------------------
    model.set_optimizer('AdamW', lr=lr)
    model.set_loss('GRPOLoss', epsilon=0.2, epsilon_high=0.28, loss_type=loss_type)
    if sampler_name == 'TorchSampler':
        sampler = resolve_class('sampler', 'TorchSampler')(model=model)  # shares the policy's weights
    else:
        sampler = resolve_class('sampler', sampler_name)(model_id=model.model_dir, engine_args={'max_model_len': 256})
    sync = CheckpointEngineManager(model=model, sampler=sampler)
    accuracy_fn, advantage_fn = MathAccuracyReward(), GRPOAdvantage(scale='group')
    reward_fn = reward_fn or accuracy_fn
    reward_metric = CompletionRewardMetric(group_size=group_size)
    mean_rewards: list[float] = []
    accuracies: list[float] = []
    ratio_means: list[float] = []
    clip_fracs: list[float] = []
    kept_fractions: list[float] = []  # dynamic sampling: informative groups / groups drawn, per step
    progress = tqdm(range(steps), desc='GRPO')
    for step in progress:
        sync.sync_weights()  # the sampler runs the current policy (nothing moves when it shares the weights)
        # each draw of the step samples with its own seed (the first: the step's, as without dynamic sampling)
        draw = partial(
            sample_groups, sampler, template, reward_fn, rng, group_size, count(seed * 100_003 + step, 7_919)
        )
        if dynamic_sampling:  # DAPO: only groups whose rewards differ, drawn until the batch is full (or capped)
            groups, stats = fill_informative_groups(draw, prompts_per_step, max_draws=4)
            kept_fractions.append(stats.kept / max(stats.drawn, 1))
            if not groups:  # every group of every draw agreed: nothing to learn from this step
                continue
        else:
            groups = draw(prompts_per_step)
        rows = rows_with_advantages(groups, advantage_fn)
        trajectories = [t for g in groups for t in g.info['trajectories']]
        rewards = [r for g in groups for r in g.rewards]
        lengths = [n for g in groups for n in g.info['lengths']]

        for update in range(updates_per_batch):
            result = model.forward_backward(inputs=rows)
            model.clip_grad_and_step(max_norm=1.0)
            if update == 0:  # on policy: the trainer's log-probs of the samples equal the sampler's (ratio 1)
                ratio_means.append(result['metrics']['ratio_mean'])
                clip_fracs.append(result['metrics']['clip_frac'])
        reward_metric.accumulate(None, {'rewards': rewards, 'completion_lengths': lengths})
        mean_rewards.append(fmean(rewards))
        accuracies.append(fmean(accuracy_fn(trajectories)) if reward_fn is not accuracy_fn else mean_rewards[-1])
        progress.set_postfix(reward=f'{mean_rewards[-1]:.2f}', clip=f'{result["metrics"]["clip_frac"]:.2f}')

    window = max(1, steps // 10)
    first, last = fmean(mean_rewards[:window]), fmean(mean_rewards[-window:])
    print(
        f'mean reward over the first {window} steps: {first:.3f}; over the last {window} steps: {last:.3f} '
        f'({last / max(first, 1e-9):.1f}x)'
    )
    print('whole run:', {k: round(v, 3) for k, v in reward_metric.calculate().items()})
    if hasattr(sampler, 'shutdown'):
        sampler.shutdown()
    return {
        'first_reward': first,
        'last_reward': last,
        'mean_rewards': mean_rewards,
        'accuracies': accuracies,
        'kept_fractions': kept_fractions,
        'ratio_means': ratio_means,
        'clip_fracs': clip_fracs,
    }


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=100)
    parser.add_argument('--group-size', type=int, default=8)
    parser.add_argument('--lr', type=float, default=5e-4)
    parser.add_argument(
        '--warmup-hint',
        type=float,
        default=0.0,
        help='fraction of right warm-start answers (0: the warm-start teaches the format only)',
    )
    parser.add_argument('--updates-per-batch', type=int, default=1)
    parser.add_argument('--loss-type', default='grpo', choices=['grpo', 'bnpo', 'dr_grpo'])
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--sampler', default='TorchSampler', help='sampler by registry name, e.g. vLLMSampler')
    parser.add_argument('--dynamic-sampling', action='store_true', help="DAPO's: train only on informative groups")
    args = parser.parse_args()
    main(
        steps=args.steps,
        group_size=args.group_size,
        warmup_hint=args.warmup_hint,
        lr=args.lr,
        updates_per_batch=args.updates_per_batch,
        loss_type=args.loss_type,
        seed=args.seed,
        sampler_name=args.sampler,
        dynamic_sampling=args.dynamic_sampling,
    )
