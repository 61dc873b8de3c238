"""Self-cognition: does the model say its new name when asked who it is, in words the training data did not use?

The questions are held out from `twinkle_core/fixtures/data/self_cognition.jsonl` (the SFT example's data): a test
asserts that none of them occurs there. Correct: the answer names the model (case-insensitive); formatted: it also
names the author.
"""

from __future__ import annotations

from typing import Any

from twinkle_core.eval.task import PromptListTask, Score
from twinkle_core.types import SamplingParams

HELD_OUT_QUESTIONS = (
    'May I ask who I am chatting with?',
    'What do people call you?',
    'Give me a one-line introduction of yourself.',
    'Which AI am I speaking to right now?',
    'Before we start, what is your name?',
    'Who built the assistant I am talking to?',
    'Are you an assistant? What is your name?',
    'Identify yourself, please.',
    'Whose assistant are you?',
    'Tell me your name and who made you.',
    'Are you Gemini?',
    'Hey there, what are you called?',
    'Which team is behind you?',
    'What name were you given?',
    'Describe who you are in a sentence.',
    'Is your name Siri?',
)


class SelfCognitionTask(PromptListTask):
    """The held-out identity questions; correct when the answer contains `model_name`."""

    name = 'self_cognition'

    def __init__(self, model_name: str = 'Twinkle', model_author: str = 'ModelScope', max_tokens: int = 40) -> None:
        self.model_name, self.model_author = model_name, model_author
        prompts = [{'messages': [{'role': 'user', 'content': q}]} for q in HELD_OUT_QUESTIONS]
        super().__init__(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))

    def score_one(self, completion: str, trajectory: dict[str, Any]) -> Score:
        text = completion.lower()
        named = self.model_name.lower() in text
        return Score(named, float(named), named and self.model_author.lower() in text)
