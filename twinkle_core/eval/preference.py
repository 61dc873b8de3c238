"""Held-out preference evaluation for preference training (DPO, ORPO, CPO, KTO): does the policy prefer the chosen
answer over the rejected one on pairs it never trained on, and by what implicit-reward margin?

    pairs = arithmetic_preference_pairs(100, split='test')        # correct vs wrong answers, held out
    rows = with_reference(model, encode_pairs(template, pairs))   # reference log-probs: the policy before training
    ...train with DPOLoss (or ORPOLoss, CPOLoss, KTOLoss)...
    evaluate_preferences(model, rows, step=40).metrics            # accuracy (+ interval), margin, rewards

Rows are interleaved like `DPOLoss` takes them (row ``2i`` chosen, ``2i+1`` rejected); the metrics are DPO's
(``accuracy``, ``margin``, ``rewards/chosen``, ``rewards/rejected``), computed from the log-probs over all held-out
pairs whatever the training loss, so they mean what `DPOLoss`'s training metrics mean, plus the accuracy's 95 %
Wilson interval.
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
    only, as the chat template marks assistant turns). A pair is ``{'messages': prompt turns, 'chosen', 'rejected'}``
    with each answer a text or a list of assistant turns (`ChosenRejectedProcessor`'s output); its ``margin``, if
    any, goes on both rows."""
    rows = []
    for pair in pairs:
        for answer in (pair['chosen'], pair['rejected']):
            turns = [{'role': 'assistant', 'content': answer}] if isinstance(answer, str) else list(answer)
            row = template.encode({'messages': [*pair['messages'], *turns]})
            if pair.get('margin') is not None:
                row['margin'] = float(pair['margin'])
            rows.append(row)
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
    beta: float = 0.1,
    name: str = 'preference',
    step: int | None = None,
    batch_size: int = 32,
) -> EvalResult:
    """How `model` ranks the held-out (chosen, rejected) `rows` (with ``ref_logps``), over every pair, without
    training and whatever loss it trains with (DPO, ORPO, CPO, KTO...): the DPO implicit rewards
    ``beta * (log p - log p_ref)`` of each answer give ``accuracy`` (chosen's above rejected's; 0 before training,
    where both are 0), ``margin``, ``rewards/chosen``, ``rewards/rejected``; ``policy_accuracy``: the policy gives
    the chosen answer a higher log-probability than the rejected one, no reference involved (what the model itself
    prefers, before training too). Both accuracies come with 95 % Wilson intervals. `step` given, the metrics go to
    every metrics logger as ``eval/{name}/...``."""
    if len(rows) % 2 or batch_size % 2:
        raise ValueError(
            f'preference rows come in (chosen, rejected) pairs and batch_size must be even: got {len(rows)} rows, '
            f'batch_size {batch_size}'
        )
    policy: list[float] = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        out = model.forward_only(inputs=chunk, compute_loss=False)
        policy.extend(answer_logprob(row, logps) for row, logps in zip(chunk, out['logprobs']))
    rewards = [beta * (pi - answer_logprob(row, row['ref_logps'])) for row, pi in zip(rows, policy)]
    pairs = len(rows) // 2
    chosen, rejected = rewards[0::2], rewards[1::2]
    metrics = {
        'accuracy': sum(c > r for c, r in zip(chosen, rejected)) / pairs,
        'margin': sum(c - r for c, r in zip(chosen, rejected)) / pairs,
        'rewards/chosen': sum(chosen) / pairs,
        'rewards/rejected': sum(rejected) / pairs,
        'policy_accuracy': sum(c > r for c, r in zip(policy[0::2], policy[1::2])) / pairs,
    }
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
