"""Held-out preference evaluation for DPO-style training: does the policy prefer the chosen answer over the rejected
one on pairs it never trained on, and by what implicit-reward margin?

    pairs = arithmetic_preference_pairs(100, split='test')        # correct vs wrong answers, held out
    rows = with_reference(model, encode_pairs(template, pairs))   # reference log-probs: the policy before training
    ...train with DPOLoss...
    evaluate_preferences(model, rows, step=40).metrics            # accuracy (+ interval), margin, rewards

Rows are interleaved like `DPOLoss` takes them (row ``2i`` chosen, ``2i+1`` rejected); the metrics are the loss's
own (``accuracy``, ``margin``, ``rewards/chosen``, ``rewards/rejected``) over all held-out pairs, so they mean what
the training metrics mean, plus the accuracy's 95 % Wilson interval.
"""

from __future__ import annotations

import random
from typing import Any

from twinkle_core.eval.arithmetic import arithmetic_prompts
from twinkle_core.eval.metrics import wilson_interval
from twinkle_core.eval.runner import EvalResult


def arithmetic_preference_pairs(
    n: int, *, split: str = 'train', seed: int = 0, max_error: int = 10
) -> list[dict[str, Any]]:
    """`n` pairs ``{'messages': [user turn], 'chosen': str, 'rejected': str}`` from `arithmetic_prompts` (`split`:
    train and test never share a problem): chosen is the result, rejected a wrong result off by 1..`max_error`."""
    rng = random.Random(seed)
    pairs = []
    for prompt in arithmetic_prompts(n, split=split, seed=seed):
        right = int(prompt['ground_truth'])
        wrong = right + rng.choice([-1, 1]) * rng.randint(1, max_error)
        pairs.append({'messages': prompt['messages'], 'chosen': str(right), 'rejected': str(wrong)})
    return pairs


def encode_pairs(template: Any, pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Interleaved rows: ``2i`` = prompt + chosen answer, ``2i+1`` = prompt + rejected answer (labels on the answer
    only, as the chat template marks assistant turns)."""
    rows = []
    for pair in pairs:
        for answer in (pair['chosen'], pair['rejected']):
            rows.append(template.encode({'messages': [*pair['messages'], {'role': 'assistant', 'content': answer}]}))
    return rows


def with_reference(model: Any, rows: list[dict[str, Any]], batch_size: int = 32) -> list[dict[str, Any]]:
    """`rows`, each with ``ref_logps``: the per-token log-probs `model` gives them now (call it before training: a
    fresh LoRA adapter is the base model, the usual DPO reference)."""
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        for row, ref in zip(chunk, model.forward_only(inputs=chunk, compute_loss=False)['logprobs']):
            row['ref_logps'] = ref
    return rows


def evaluate_preferences(
    model: Any,
    rows: list[dict[str, Any]],
    *,
    name: str = 'preference',
    step: int | None = None,
    batch_size: int = 32,
) -> EvalResult:
    """The `DPOLoss` metrics `model` (its loss set to `DPOLoss`) gives the held-out `rows` (with ``ref_logps``),
    over every pair, without training: ``accuracy`` (chosen's implicit reward above rejected's; 0 before training,
    where both are 0), ``margin``, ``rewards/chosen``, ``rewards/rejected``; and ``policy_accuracy``: the policy
    gives the chosen answer a higher log-probability than the rejected one, no reference involved (what the model
    itself prefers, before training too). Both accuracies come with 95 % Wilson intervals. `step` given, the metrics
    go to every metrics logger as ``eval/{name}/...``."""
    if len(rows) % 2 or batch_size % 2:
        raise ValueError(
            f'preference rows come in (chosen, rejected) pairs and batch_size must be even: got {len(rows)} rows, '
            f'batch_size {batch_size}'
        )
    totals: dict[str, float] = {}
    preferred = 0
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        out = model.forward_only(inputs=chunk)
        for key in ('accuracy', 'margin', 'rewards/chosen', 'rewards/rejected'):
            totals[key] = totals.get(key, 0.0) + float(out['metrics'][key]) * len(chunk) / 2
        answer = [answer_logprob(row, logps) for row, logps in zip(chunk, out['logprobs'])]
        preferred += sum(chosen > rejected for chosen, rejected in zip(answer[0::2], answer[1::2]))
    pairs = len(rows) // 2
    metrics = {key: value / pairs for key, value in totals.items()}
    metrics['policy_accuracy'] = preferred / pairs
    for key in ('accuracy', 'policy_accuracy'):
        metrics[f'{key}_low'], metrics[f'{key}_high'] = wilson_interval(round(metrics[key] * pairs), pairs)
    metrics['pairs'] = float(pairs)
    result = EvalResult(name, metrics)
    if step is not None:
        result.emit(step)
    return result


def answer_logprob(row: dict[str, Any], logprobs: list[float]) -> float:
    """The log-probability of a row's answer: its per-token log-probs (aligned with ``input_ids``) summed over the
    positions the row trains on (``labels`` != -100)."""
    return sum(lp for lp, label in zip(logprobs, row['labels']) if label != -100)
