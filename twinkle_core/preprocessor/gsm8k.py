"""GSM8K rows ``{question, answer}`` -> a Trajectory with the numeric `ground_truth` kept for rewards."""

from __future__ import annotations

import re
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.preprocessor.base import Preprocessor, require_fields, row_excerpt
from twinkle_core.preprocessor.messages_util import message, with_system

GSM8K_SYSTEM = (
    'Solve the math problem step by step. At the end, give the final answer as a number after '
    "'####' (for example '#### 42') or in \\boxed{}."
)
_NUMBER = re.compile(r'-?\d[\d,]*(?:\.\d+)?')


def extract_gsm8k_answer(text: str) -> str | None:
    """The number after the last ``####`` in a GSM8K solution, commas removed (``'1,200'`` -> ``'1200'``)."""
    if '####' not in text:
        return None
    match = _NUMBER.search(text.rsplit('####', 1)[1])
    return match.group(0).replace(',', '') if match else None


class GSM8KProcessor(Preprocessor):
    """``{'messages': [system, user(question), assistant(answer)], 'ground_truth': '<number>'}``.

    The assistant turn is the reference solution (for SFT); RL encodes the prompt only
    (``Template.encode(..., add_generation_prompt=True)`` drops the final assistant turn).
    """

    def __init__(self, system: str | None = GSM8K_SYSTEM) -> None:
        self.system = system

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        require_fields(row, ('question', 'answer'), type(self).__name__)
        answer = str(row['answer'])
        truth = extract_gsm8k_answer(answer)
        if truth is None:
            raise InvalidInputError(
                f"{type(self).__name__}: field 'answer' has no final number after '####'. Row: {row_excerpt(row)}"
            )
        messages = with_system(self.system, [message('user', str(row['question'])), message('assistant', answer)])
        return {'messages': messages, 'ground_truth': truth}
