"""GKD: distil a teacher into the tiny fixture model with the generalised JSD (CPU, a couple of minutes).

1. Teacher: the 'small' fixture model (~11M parameters), quickly SFT'd on single-digit addition.
2. Student: the 'tiny' fixture model (~3M), trained with `GKDLoss(teacher_model=teacher)`: the loss runs the
   teacher on each collated batch (no gradients) and matches the student's token distributions to the teacher's
   at every completion token.

Where the training sequences come from is what makes distillation on- or off-policy (the loss is the same):

- off-policy (supervised KD): prompt + the dataset's answer;
- on-policy: prompt + a completion *sampled from the student* (`TorchSampler(model=student)` shares its weights).

``--on-policy-fraction`` (the GKD paper's lambda) picks, per step, which of the two to train on. The divergence
reported is the student-teacher JSD on a fixed held-out set, measured with `forward_only` before and after.

    python examples/gkd.py
    python examples/gkd.py --on-policy-fraction 1.0
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from tqdm import tqdm

from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve
from twinkle_core.sampler import TorchSampler
from twinkle_core.types import SamplingParams


def addition_examples(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """`n` trajectories ``user 'a+b=' -> assistant 'a+b'`` with operands in [0, 4]."""
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 4), rng.randint(0, 4)
        out.append(
            {'messages': [{'role': 'user', 'content': f'{a}+{b}='}, {'role': 'assistant', 'content': str(a + b)}]}
        )
    return out


def sampled_rows(sampler: TorchSampler, template: Any, examples: list[dict[str, Any]], seed: int) -> list[dict]:
    """On-policy rows: each prompt followed by a completion the student samples itself (labels on it only)."""
    prompts = [template.encode(e, add_generation_prompt=True) for e in examples]
    responses = sampler.sample(prompts, SamplingParams(max_tokens=4, temperature=1.0, seed=seed))
    rows = []
    for prompt, response in zip(prompts, responses):
        tokens = response.sequences[0].tokens
        rows.append({'input_ids': prompt['input_ids'] + tokens, 'labels': [-100] * len(prompt['input_ids']) + tokens})
    return rows


def main(
    steps: int = 60,
    batch_size: int = 16,
    teacher_steps: int = 120,
    on_policy_fraction: float = 0.5,
    beta: float = 0.5,
    lr: float = 1e-3,
    seed: int = 0,
) -> dict[str, Any]:
    rng = random.Random(seed)

    # ---- 1. teacher: SFT the 'small' fixture model on the task -------------------------------------------------
    teacher = TransformersModel(model_id=ensure_tiny_model('small'))
    template = resolve('template', 'Template', model_id_or_tokenizer=teacher.tokenizer)
    teacher.set_optimizer('AdamW', lr=2e-3)
    for _ in tqdm(range(teacher_steps), desc='teacher SFT'):
        teacher.forward_backward(inputs=[template.encode(e) for e in addition_examples(rng, batch_size)])
        teacher.clip_grad_and_step()

    # ---- 2. student: GKD against the teacher ----------------------------------------------------------------
    student = TransformersModel(model_id=ensure_tiny_model('tiny'))
    student.set_optimizer('AdamW', lr=lr)
    student.set_loss('GKDLoss', beta=beta, teacher_model=teacher.model)
    sampler = TorchSampler(model=student)
    held_out = [template.encode(e) for e in addition_examples(random.Random(seed + 1), 64)]
    divergence_before = student.forward_only(inputs=held_out)['loss']

    losses = []
    progress = tqdm(range(steps), desc='GKD')
    for step in progress:
        examples = addition_examples(rng, batch_size)
        if rng.random() < on_policy_fraction:
            rows = sampled_rows(sampler, template, examples, seed=seed * 100_003 + step)
        else:
            rows = [template.encode(e) for e in examples]
        losses.append(student.forward_backward(inputs=rows)['loss'])
        student.clip_grad_and_step(max_norm=1.0)
        progress.set_postfix(jsd=f'{losses[-1]:.4f}')

    divergence_after = student.forward_only(inputs=held_out)['loss']
    print(
        f'student-teacher JSD (beta={beta}) on held-out completions: {divergence_before:.4f} -> '
        f'{divergence_after:.4f} ({divergence_after / divergence_before:.2f}x)'
    )
    return {'divergence_before': divergence_before, 'divergence_after': divergence_after, 'train_losses': losses}


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--steps', type=int, default=60)
    parser.add_argument('--on-policy-fraction', type=float, default=0.5)
    parser.add_argument('--beta', type=float, default=0.5)
    parser.add_argument('--lr', type=float, default=1e-3)
    args = parser.parse_args()
    main(steps=args.steps, on_policy_fraction=args.on_policy_fraction, beta=args.beta, lr=args.lr)
