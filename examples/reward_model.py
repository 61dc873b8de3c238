"""A reward model, then GRPO against it: the "repeat d" task with a learnt reward in place of the exact one.

1. **Pairs**: for "repeat d" prompts, the chosen answer is ``d`` and the rejected one another digit; the held-out
   pairs are draws of their own (the task has only 90 digit combinations, so they are all seen in training). With
   ``--unseen-combinations`` a quarter of the combinations never appear in training and the held-out pairs use
   only those: ranking them takes having learnt *equality* itself (0.92 after 60 steps, 1.00 after 120).
2. **Reward model**: `TransformersValueModel` (the tiny fixture with a scalar head) trained with `BradleyTerryLoss`;
   its score of a conversation is the head's output after the last token. Ranking accuracy on the held-out pairs.
3. **GRPO with the reward model as the reward** (`RewardModelReward` by path; examples/grpo.py's loop): the
   policy's judged reward rises -- and so does its exact accuracy, which it never sees.

    python examples/reward_model.py                   # ~3 minutes on one CPU core
    python examples/reward_model.py --grpo-steps 0    # the reward model only
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import tempfile
from pathlib import Path
from statistics import fmean
from types import ModuleType
from typing import Any

from tqdm import tqdm

from twinkle_core.eval.preference import encode_pairs
from twinkle_core.fixtures.repeat_task import repeat_prompts
from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_core.model import TransformersValueModel
from twinkle_core.registry import resolve


def sibling_example(name: str) -> ModuleType:
    """Another example of this folder, loaded by its path (so that this file runs from anywhere)."""
    spec = importlib.util.spec_from_file_location(f'twinkle_example_{name}', Path(__file__).with_name(f'{name}.py'))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def held_out_combination(right: int, wrong: int) -> bool:
    """The (right, wrong) digit pairs kept out of training: a quarter of them."""
    return (right + 2 * wrong) % 4 == 0


def repeat_pairs(rng: random.Random, n: int, *, held_out: bool | None = None) -> list[dict[str, Any]]:
    """`n` pairs ``{'messages': ['repeat d'], 'chosen': 'd', 'rejected': 'w'}``; `held_out` True / False: only the
    (d, w) combinations that are / are not `held_out_combination` (None: any)."""
    pairs: list[dict[str, Any]] = []
    while len(pairs) < n:
        prompt = repeat_prompts(rng, 1)[0]
        right, wrong = int(prompt['ground_truth']), rng.randint(0, 9)
        if wrong != right and held_out in (None, held_out_combination(right, wrong)):
            pairs.append({'messages': prompt['messages'], 'chosen': str(right), 'rejected': str(wrong)})
    return pairs


def ranking_accuracy(reward_model: Any, rows: list[dict[str, Any]]) -> float:
    """Share of (chosen, rejected) row pairs the reward model scores in the right order."""
    scores = reward_model.forward_only(inputs=rows, compute_loss=False)['scores']
    return fmean(float(scores[i] > scores[i + 1]) for i in range(0, len(scores), 2))


def train_reward_model(
    steps: int = 60,
    pairs_per_step: int = 32,
    lr: float = 5e-4,
    seed: int = 0,
    output_dir: str | None = None,
    unseen_combinations: bool = False,
) -> dict[str, Any]:
    """Train the reward model; returns its checkpoint directory and the held-out ranking accuracy before/after."""
    train_split, test_split = (False, True) if unseen_combinations else (None, None)
    rng = random.Random(seed)
    reward_model = TransformersValueModel(model_id=ensure_tiny_model('tiny'), head_init='normal', head_seed=seed)
    reward_model.set_loss('BradleyTerryLoss')
    reward_model.set_optimizer('AdamW', lr=lr)
    template = resolve('template', 'Template', model_id_or_tokenizer=reward_model.tokenizer)
    test_rows = encode_pairs(template, repeat_pairs(random.Random(seed + 1), 100, held_out=test_split))
    before = ranking_accuracy(reward_model, test_rows)
    progress = tqdm(range(steps), desc='reward model')
    for _ in progress:
        out = reward_model.forward_backward(
            inputs=encode_pairs(template, repeat_pairs(rng, pairs_per_step, held_out=train_split))
        )
        reward_model.clip_grad_and_step(max_norm=1.0)
        progress.set_postfix(loss=f'{out["loss"]:.3f}', accuracy=f'{out["metrics"]["accuracy"]:.2f}')
    after = ranking_accuracy(reward_model, test_rows)
    saved = reward_model.save('reward_model', output_dir=output_dir or tempfile.mkdtemp(prefix='twinkle-rm-'))
    print(f'held-out ranking accuracy: {before:.2f} -> {after:.2f}')
    return {'checkpoint': str(saved), 'accuracy_before': before, 'accuracy_after': after}


def main(
    rm_steps: int = 60,
    grpo_steps: int = 100,
    seed: int = 0,
    output_dir: str | None = None,
    unseen_combinations: bool = False,
) -> dict[str, Any]:
    result = train_reward_model(
        steps=rm_steps, seed=seed, output_dir=output_dir, unseen_combinations=unseen_combinations
    )
    if grpo_steps:
        reward = resolve('reward', 'RewardModelReward', model=result['checkpoint'], batch_size=64)
        result['grpo'] = sibling_example('grpo').main(steps=grpo_steps, seed=seed, reward_fn=reward)
        half = grpo_steps // 2
        for name in ('mean_rewards', 'accuracies'):
            values = result['grpo'][name]
            print(f'{name}: first half {fmean(values[:half]):.3f}, second half {fmean(values[half:]):.3f}')
    return result


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--rm-steps', type=int, default=60)
    parser.add_argument('--grpo-steps', type=int, default=100)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--output-dir', default=None)
    parser.add_argument('--unseen-combinations', action='store_true', help='held-out pairs of untrained combinations')
    args = parser.parse_args()
    main(
        rm_steps=args.rm_steps,
        grpo_steps=args.grpo_steps,
        seed=args.seed,
        output_dir=args.output_dir,
        unseen_combinations=args.unseen_combinations,
    )
