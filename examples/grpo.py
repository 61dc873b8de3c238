"""GRPO on CPU with the tiny fixture model: learn single-digit addition ("3+4=" -> "7") from a 0/1 reward.

The loop is the whole algorithm, top to bottom:

1. sample ``group_size`` completions per prompt -- `TorchSampler(model=model)` shares the training model's weights,
   so the sampler always runs the current policy and no weight sync is needed;
2. score them (`MathAccuracyReward`: the completion's number equals the ``ground_truth`` field);
3. group-relative advantages (`GRPOAdvantage`);
4. one `GRPOLoss` step on the (prompt + completion) rows, with the sampler's log-probs as ``old_logps``.

The fixture model starts from random weights, so a short SFT warm-start first teaches the answer *format* only
(one digit, then end of turn) with **random** digits: the reward starts at chance level (about 1/9) and everything
above it is learnt from the reward.

    python examples/grpo.py                # ~1-2 minutes on a laptop CPU
    python examples/grpo.py --steps 200
"""
from __future__ import annotations

import argparse
import random
from statistics import fmean
from typing import Any

from tqdm import tqdm

from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_core.metric import CompletionRewardMetric
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve
from twinkle_core.reward import MathAccuracyReward
from twinkle_core.sampler import TorchSampler
from twinkle_core.types import SamplingParams


def addition_prompts(rng: random.Random, n: int, max_operand: int) -> list[dict[str, Any]]:
    """`n` prompts ``{'messages': [user 'a+b='], 'ground_truth': 'a+b'}`` with operands in [0, max_operand]."""
    prompts = []
    for _ in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        prompts.append({'messages': [{'role': 'user', 'content': f'{a}+{b}='}], 'ground_truth': str(a + b)})
    return prompts


def repeat_prompts(rng: random.Random, n: int, max_operand: int) -> list[dict[str, Any]]:
    prompts = []
    for _ in range(n):
        a = rng.randint(0, 9)
        prompts.append({'messages': [{'role': 'user', 'content': f'Repeat: {a}'}], 'ground_truth': str(a)})
    return prompts


TASKS = {'add': addition_prompts, 'repeat': repeat_prompts}
WARM = {  # the warm-start's answer for a prompt
    'format': lambda p, rng: str(rng.randint(0, 9)),
    'answers': lambda p, rng: p['ground_truth'],
    'noisy': lambda p, rng: p['ground_truth'] if rng.random() < 0.5 else str(rng.randint(0, 9)),
}


def main(steps: int = 60, prompts_per_step: int = 16, group_size: int = 8, warmup_steps: int = 30,
         max_operand: int = 4, lr: float = 2e-4, seed: int = 0, warmup: str = 'format', task: str = 'add', updates_per_batch: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    model = TransformersModel(model_id=ensure_tiny_model('tiny'))
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)
    model.set_optimizer('AdamW', lr=3e-3)

    # ---- 1. format warm-start: "<digit><|im_end|>" with a random digit (teaches the format, not the sums) ----
    model.set_loss('CrossEntropyLoss')
    for _ in tqdm(range(warmup_steps), desc='format warm-start'):
        rows = [template.encode({'messages': p['messages'] + [{'role': 'assistant', 'content': WARM[warmup](p, rng)}]})
                for p in TASKS[task](rng, 16, max_operand)]
        model.forward_backward(inputs=rows)
        model.clip_grad_and_step()

    # ---- 2. GRPO ------------------------------------------------------------------------------------------
    model.set_optimizer('AdamW', lr=lr)
    model.set_loss('GRPOLoss', epsilon=0.2, epsilon_high=0.28, loss_type='grpo')
    sampler = TorchSampler(model=model)
    reward_fn, advantage_fn = MathAccuracyReward(), GRPOAdvantage(scale='group')
    reward_metric = CompletionRewardMetric(group_size=group_size)
    mean_rewards: list[float] = []
    progress = tqdm(range(steps), desc='GRPO')
    for step in progress:
        prompts = TASKS[task](rng, prompts_per_step, max_operand)
        prompt_rows = [template.encode(p, add_generation_prompt=True) for p in prompts]
        responses = sampler.sample(prompt_rows, SamplingParams(max_tokens=4, temperature=1.0, num_samples=group_size,
                                                               seed=seed * 100_003 + step))
        trajectories, rows, lengths = [], [], []
        for prompt, prompt_row, response in zip(prompts, prompt_rows, responses):
            ids = prompt_row['input_ids']
            for seq in response.sequences:
                trajectories.append({**prompt, 'messages': [*prompt['messages'],
                                                            {'role': 'assistant', 'content': seq.text or ''}]})
                rows.append({'input_ids': ids + seq.tokens, 'labels': [-100] * len(ids) + seq.tokens,
                             'old_logps': [0.0] * len(ids) + seq.logprobs})
                lengths.append(len(seq.tokens))
        rewards = reward_fn(trajectories)
        for row, advantage in zip(rows, advantage_fn(rewards, group_size=group_size)):
            row['advantage'] = advantage
        for _ in range(updates_per_batch):  # later updates are off-policy: the ratio to old_logps is clipped
            model.forward_backward(inputs=rows)
            model.clip_grad_and_step(max_norm=1.0)

        reward_metric.accumulate(None, {'rewards': rewards, 'completion_lengths': lengths})
        mean_rewards.append(fmean(rewards))
        progress.set_postfix(reward=f'{mean_rewards[-1]:.2f}')

    window = max(1, steps // 10)
    first, last = fmean(mean_rewards[:window]), fmean(mean_rewards[-window:])
    print(f'mean reward over the first {window} steps: {first:.3f}; over the last {window} steps: {last:.3f} '
          f'({last / max(first, 1e-9):.1f}x)')
    print('whole run:', {k: round(v, 3) for k, v in reward_metric.calculate().items()})
    return {'first_reward': first, 'last_reward': last, 'mean_rewards': mean_rewards}


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=60)
    parser.add_argument('--group-size', type=int, default=8)
    parser.add_argument('--lr', type=float, default=2e-4)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    main(steps=args.steps, group_size=args.group_size, lr=args.lr, seed=args.seed)
