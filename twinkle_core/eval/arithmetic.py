"""Seeded arithmetic with disjoint train and test splits: "What is a + b? Answer with just the number."

Every operand pair of the range belongs to exactly one split, decided by a hash of the pair (``test_fraction`` of
them are test), so a model trained on `arithmetic_prompts(split='train')` never sees a test problem. Correct: the
completion's last number equals the result; formatted: the completion is just a number.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from twinkle_core.eval.task import PromptListTask, Score
from twinkle_core.reward.answers import answers_match, extract_last_number
from twinkle_core.types import SamplingParams

OPERATIONS = {'+': lambda a, b: a + b, '-': lambda a, b: a - b, '*': lambda a, b: a * b}
QUESTION = 'What is {a} {op} {b}? Answer with just the number.'
JUST_A_NUMBER = re.compile(r'\s*-?\d+\s*')


def split_of(a: int, b: int, op: str, test_fraction: float) -> str:
    """'test' or 'train': the split of the problem ``a op b`` (stable across runs and machines)."""
    digest = hashlib.sha256(f'{a}{op}{b}'.encode()).digest()
    return 'test' if int.from_bytes(digest[:4], 'big') / 2**32 < test_fraction else 'train'


def arithmetic_prompts(
    n: int,
    *,
    split: str = 'test',
    seed: int = 0,
    low: int = 10,
    high: int = 99,
    ops: str = '+',
    test_fraction: float = 0.2,
) -> list[dict[str, Any]]:
    """`n` distinct problems of `split` (operands in [low, high], operations from `ops`), in a seeded order: Trajectory
    dicts with the question as the user turn and ``ground_truth`` the result."""
    if split not in ('train', 'test'):
        raise ValueError(f"split is 'train' or 'test', not {split!r}")
    unknown = set(ops) - set(OPERATIONS)
    if unknown or not ops:
        raise ValueError(f'ops takes characters of {"".join(OPERATIONS)!r}, got {ops!r}')
    problems = [
        (a, op, b)
        for op in ops
        for a in range(low, high + 1)
        for b in range(low, high + 1)
        if split_of(a, b, op, test_fraction) == split
    ]
    if n > len(problems):
        raise ValueError(f'asked for {n} {split} problems, the range holds {len(problems)}')
    random.Random(seed).shuffle(problems)
    return [
        {
            'messages': [{'role': 'user', 'content': QUESTION.format(a=a, op=op, b=b)}],
            'ground_truth': str(OPERATIONS[op](a, b)),
        }
        for a, op, b in problems[:n]
    ]


class ArithmeticTask(PromptListTask):
    """`size` held-out (test-split) problems, answered greedily in at most `max_tokens` tokens."""

    name = 'arithmetic'

    def __init__(
        self, size: int = 200, *, seed: int = 0, low: int = 10, high: int = 99, ops: str = '+', max_tokens: int = 16
    ) -> None:
        prompts = arithmetic_prompts(size, split='test', seed=seed, low=low, high=high, ops=ops)
        super().__init__(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))

    def score_one(self, completion: str, trajectory: dict[str, Any]) -> Score:
        correct = answers_match(extract_last_number(completion), trajectory['ground_truth'])
        return Score(correct, float(correct), JUST_A_NUMBER.fullmatch(completion) is not None)
