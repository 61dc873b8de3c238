"""GRPO on images, on CPU with the tiny Qwen3-VL fixture: "What colour is this?" -> the colour's name.

The same loop as `examples/grpo.py`, with image prompts:

1. sample ``group_size`` completions per image prompt -- `TorchSampler(model=model)` shares the training model's
   weights, so the weight sync before each step moves nothing; prompts are the colour Trajectories themselves
   (PNG bytes + ``<image>`` tag), which the sampler encodes with the model's `VisionTemplate`;
2. score them: 1.0 when the completion is exactly the image's colour name (``red``, ``green``, ``blue``,
   ``yellow``), else 0.0;
3. group-relative advantages (`GRPOAdvantage`), one per completion;
4. a `GRPOLoss` step on each sample's ``new_input_feature`` -- prompt + completion with its image fields
   (``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``), labels on the completion only -- with the
   sampler's log-probs as ``old_logps``.

Design of the toy task (the model is a 2-layer random-init VL model; it never says a colour word by chance):
a short SFT warm-start teaches the answer *format* only -- every answer in it is a random colour name, unrelated
to the image -- so afterwards the policy answers some colour name and stops, right about 1 time in 4. Which
colour the image shows is learnt from the reward alone: the mean reward rising above ~0.25 is the GRPO signal.
Training is full-parameter with the vision tower frozen (its random features of the four colours differ, which
is all the task needs). Not LoRA: in a random-init model the tied output embedding is tiny, so the logits stay
nearly flat whatever LoRA does to the hidden layers (the warm-start loss stalls near log(vocab)).

    python examples/grpo_vl.py              # about 1 minute on two idle CPU cores
    python examples/grpo_vl.py --steps 80   # the reward keeps rising
"""

from __future__ import annotations

import argparse
import random
from statistics import fmean
from typing import Any, Sequence

import torch

from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.checkpoint_engine import CheckpointEngineManager
from twinkle_core.fixtures.images import COLOURS, colour_trajectories
from twinkle_core.fixtures.tiny_vl_model import ensure_tiny_vl_model
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve, resolve_class
from twinkle_core.reward.answers import completion_text, ground_truth
from twinkle_core.types import SamplingParams


def colour_prompts(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """`n` colour-task prompts (a user turn with the image; ``ground_truth`` = the colour): each of the four
    colours once, then colours at random (noisy images, a fresh seed per call)."""
    return colour_trajectories(n, seed=rng.randrange(1 << 30), with_answer=False)


def colour_reward(trajectories: Sequence[dict[str, Any]]) -> list[float]:
    """1.0 when the completion (last message) is exactly the ``ground_truth`` colour name, else 0.0."""
    return [
        float(
            completion_text(t, i, 'colour_reward').strip().lower()
            == ground_truth(t, i, ['ground_truth'], 'colour_reward')
        )
        for i, t in enumerate(trajectories)
    ]


def format_warmup(model: TransformersModel, template: Any, rng: random.Random, steps: int, batch: int = 16) -> None:
    """SFT on random colour names (not the image's): teaches "answer one colour name, then end the turn"."""
    names = list(COLOURS)
    for _ in range(steps):
        answered = [
            {**p, 'messages': [*p['messages'], {'role': 'assistant', 'content': rng.choice(names)}]}
            for p in colour_prompts(rng, batch)
        ]
        rows = [template.encode(trajectory) for trajectory in answered]
        model.forward_backward(inputs=rows)  # default loss: cross-entropy on the answer tokens
        model.clip_grad_and_step()


def grpo_steps(
    model: TransformersModel,
    sampler: Any,
    rng: random.Random,
    *,
    steps: int,
    prompts_per_step: int,
    group_size: int,
    updates_per_batch: int = 1,
    seed: int = 0,
    log: bool = True,
) -> list[float]:
    """The GRPO loop (model's loss and optimizer already set); returns the mean reward of every step.
    `updates_per_batch` > 1: later updates on the same samples are off-policy (the ratio clip is active)."""
    sync = CheckpointEngineManager(model=model, sampler=sampler)
    advantage_fn = GRPOAdvantage(scale='group')
    mean_rewards: list[float] = []
    for step in range(steps):
        sync.sync_weights()  # nothing moves: the sampler runs the policy's own module
        params = SamplingParams(max_tokens=6, temperature=1.0, num_samples=group_size, seed=seed * 100_003 + step)
        responses = sampler.sample(colour_prompts(rng, prompts_per_step), params)
        samples = [seq for response in responses for seq in response.sequences]
        rewards = colour_reward([seq.new_input_feature for seq in samples])  # messages end with the completion
        rows = []
        for seq, advantage in zip(samples, advantage_fn(rewards, group_size=group_size)):
            row = dict(seq.new_input_feature)  # prompt + completion, image fields included
            prompt_len = len(row['input_ids']) - len(seq.tokens)
            row.update(old_logps=[0.0] * prompt_len + seq.logprobs, advantage=advantage)
            rows.append(row)
        for _ in range(updates_per_batch):
            result = model.forward_backward(inputs=rows)
            model.clip_grad_and_step(max_norm=1.0)
        mean_rewards.append(fmean(rewards))
        if log:
            print(
                f'step {step + 1:3d}  mean reward {mean_rewards[-1]:.3f}  '
                f'clip {result["metrics"].get("clip_frac", 0.0):.2f}  e.g. {samples[0].text!r}',
                flush=True,
            )
    return mean_rewards


def main(
    steps: int = 40,
    prompts_per_step: int = 16,
    group_size: int = 8,
    warmup_steps: int = 60,
    lr: float = 1e-3,
    updates_per_batch: int = 2,
    seed: int = 0,
    log: bool = True,
) -> dict[str, Any]:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model_dir = ensure_tiny_vl_model('qwen3_vl')
    model = TransformersModel(model_id=model_dir, freeze_vision_tower=True)
    template = resolve('template', 'VisionTemplate', model_id_or_tokenizer=str(model_dir))

    model.set_optimizer('AdamW', lr=3e-3)
    format_warmup(model, template, rng, warmup_steps)

    model.set_optimizer('AdamW', lr=lr)
    model.set_loss('GRPOLoss', epsilon=0.2, epsilon_high=0.28)
    sampler = resolve_class('sampler', 'TorchSampler')(model=model)  # shares the policy's weights
    mean_rewards = grpo_steps(
        model,
        sampler,
        rng,
        steps=steps,
        prompts_per_step=prompts_per_step,
        group_size=group_size,
        updates_per_batch=updates_per_batch,
        seed=seed,
        log=log,
    )
    window = max(1, steps // 5)
    first, last = fmean(mean_rewards[:window]), fmean(mean_rewards[-window:])
    print(f'mean reward over the first {window} steps: {first:.3f}; over the last {window} steps: {last:.3f}')
    return {'first_reward': first, 'last_reward': last, 'mean_rewards': mean_rewards}


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=40)
    parser.add_argument('--prompts-per-step', type=int, default=16)
    parser.add_argument('--group-size', type=int, default=8)
    parser.add_argument('--warmup-steps', type=int, default=60)
    parser.add_argument('--lr', type=float, default=1e-3)
    parser.add_argument(
        '--updates-per-batch',
        type=int,
        default=2,
        help='updates per sampled batch (later ones are off-policy: the ratio clip is active)',
    )
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    main(
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        warmup_steps=args.warmup_steps,
        lr=args.lr,
        updates_per_batch=args.updates_per_batch,
        seed=args.seed,
    )
