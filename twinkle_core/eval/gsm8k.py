"""GSM8K-format word problems from a local JSONL file (``question`` and ``answer`` ending in ``#### N``).

`path`: e.g. the test split of openai/gsm8k (``test.jsonl``) for a real score, or the 36-problem sample shipped
with the core (``twinkle_core.fixtures.data_path('gsm8k_sample.jsonl')``) to try the task. Correct: the
completion's answer (`GSM8KAccuracyReward`: its ``<answer>`` tag, else what follows ``####``, else its last number)
equals the reference; formatted: it ends with ``#### N`` as the prompt asks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from twinkle_core.eval.task import PromptListTask, Score, completion_of
from twinkle_core.reward.accuracy import GSM8KAccuracyReward
from twinkle_core.types import SamplingParams

INSTRUCTION = 'Solve the problem step by step, then give the final answer on its own line as "#### <number>".'
FINAL_LINE = re.compile(r'(?s).*####\s*-?[\d,]+(\.\d+)?\s*')


class GSM8KTask(PromptListTask):
    """The problems of `path` (the first `limit`), answered greedily in at most `max_tokens` tokens."""

    name = 'gsm8k'

    def __init__(self, path: str, limit: int | None = None, max_tokens: int = 256) -> None:
        source = Path(path)
        if not source.is_file():
            raise FileNotFoundError(f'no GSM8K file at {source}')
        rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
        bad = [i for i, r in enumerate(rows) if not {'question', 'answer'} <= set(r)]
        if bad:
            raise ValueError(f'{source}: rows {bad[:5]} lack "question" or "answer"')
        prompts = [
            {'messages': [{'role': 'user', 'content': f'{r["question"]}\n{INSTRUCTION}'}], 'answer': r['answer']}
            for r in rows[:limit]
        ]
        super().__init__(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))
        self._accuracy = GSM8KAccuracyReward()

    def score(self, trajectories: Sequence[dict[str, Any]]) -> list[Score]:
        correct = self._accuracy(trajectories)
        return [
            Score(c == 1.0, c, FINAL_LINE.fullmatch(completion_of(t)) is not None)
            for c, t in zip(correct, trajectories)
        ]
