"""Instruction-format rules in the manner of IFEval: each prompt carries a verifiable instruction, and a rule checks
the answer without a model (word counts, case, forbidden characters, required endings, quoting, bullet lists).

Correct: the rule holds; formatted: the answer is non-empty; reward: 1.0 / 0.0.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from twinkle_core.eval.task import PromptListTask, Score
from twinkle_core.types import SamplingParams

Rule = Callable[[str], bool]


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9']+", text)


#: (instruction appended to the topic, the rule the answer must satisfy)
RULES: dict[str, tuple[str, Rule]] = {
    'lowercase': ('Answer in lowercase letters only.', lambda t: t.strip() != '' and t == t.lower()),
    'uppercase': ('Answer in capital letters only.', lambda t: t.strip() != '' and t == t.upper()),
    'no_commas': ('Do not use any commas in your answer.', lambda t: t.strip() != '' and ',' not in t),
    'max_10_words': ('Answer in at most 10 words.', lambda t: 0 < len(_words(t)) <= 10),
    'three_bullets': (
        'Answer with exactly three bullet points, each line starting with "- ".',
        lambda t: len([line for line in t.strip().splitlines() if line.startswith('- ')]) == 3,
    ),
    'quoted': (
        'Wrap your whole answer in double quotation marks.',
        lambda t: re.fullmatch(r'\s*".*"\s*', t, re.S) is not None,
    ),
    'ends_with_done': (
        'End your answer with the word "done".',
        lambda t: re.search(r'\bdone\W*$', t.strip(), re.I) is not None,
    ),
    'one_word': ('Answer with a single word.', lambda t: len(_words(t)) == 1),
}
TOPICS = (
    'Name a colour of the sky.',
    'What is a good breakfast?',
    'Describe a cat.',
    'Why do people travel?',
    'What is your favourite season?',
    'Give advice for learning to code.',
)


class InstructionFormatTask(PromptListTask):
    """Every topic with every rule in `rules` (default: all of `RULES`), answered greedily."""

    name = 'instruction_format'

    def __init__(self, rules: Sequence[str] | None = None, max_tokens: int = 64) -> None:
        names = list(rules) if rules is not None else list(RULES)
        unknown = sorted(set(names) - set(RULES))
        if unknown:
            raise ValueError(f'unknown instruction rules {unknown}; known: {sorted(RULES)}')
        prompts = [
            {'messages': [{'role': 'user', 'content': f'{topic} {RULES[rule][0]}'}], 'rule': rule}
            for rule in names
            for topic in TOPICS
        ]
        super().__init__(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))

    def score_one(self, completion: str, trajectory: dict[str, Any]) -> Score:
        ok = RULES[trajectory['rule']][1](completion)
        return Score(ok, float(ok), completion.strip() != '')
