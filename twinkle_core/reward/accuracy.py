"""Verifiable-answer rewards: 1.0 when the completion's final answer equals the ground truth, else 0.0.

Each scores Trajectory dicts: the completion is the last (assistant) message; the reference answer is the first
present field of ``answer_fields`` (default ``ground_truth``, then ``answer``, then ``solution``).
"""

from __future__ import annotations

from typing import Any, Sequence

from twinkle_core.reward.answers import (
    answers_match,
    completion_text,
    extract_boxed,
    extract_gsm8k_marker,
    extract_last_number,
    extract_tag,
    ground_truth,
)
from twinkle_core.reward.base import Reward

DEFAULT_ANSWER_FIELDS = ('ground_truth', 'answer', 'solution')


class MathAccuracyReward(Reward):
    """Math answers: the last ``\\boxed{}`` of the completion, else its ``<answer_tag>`` content, else its last
    number (``boxed_only=True`` disables the fallbacks). A reference containing ``\\boxed{}`` (a MATH solution) is
    reduced to that box. Equivalence is numeric when both sides parse as numbers (``0.5 == 1/2 == \\frac{1}{2}``,
    ``1,000 == 1000``), otherwise a comparison of LaTeX-normalised strings.
    """

    def __init__(
        self, answer_fields: Sequence[str] = DEFAULT_ANSWER_FIELDS, answer_tag: str = 'answer', boxed_only: bool = False
    ) -> None:
        self.answer_fields, self.answer_tag, self.boxed_only = tuple(answer_fields), answer_tag, boxed_only

    def extract(self, completion: str) -> str | None:
        boxed = extract_boxed(completion)
        if boxed is not None or self.boxed_only:
            return boxed
        tagged = extract_tag(completion, self.answer_tag)
        if tagged is not None:
            return extract_boxed(tagged) or tagged
        return extract_last_number(completion)

    def reference(self, text: str) -> str:
        return extract_boxed(text) or text.strip()

    def __call__(self, trajectories: Sequence[dict[str, Any]], **kwargs: Any) -> list[float]:
        who = type(self).__name__
        scores = []
        for i, trajectory in enumerate(trajectories):
            predicted = self.extract(completion_text(trajectory, i, who))
            reference = self.reference(ground_truth(trajectory, i, self.answer_fields, who))
            scores.append(1.0 if answers_match(predicted, reference) else 0.0)
        return scores


class GSM8KAccuracyReward(MathAccuracyReward):
    """GSM8K: the reference is what follows ``####`` in the dataset's answer (or the whole field). The completion's
    answer is its ``<answer_tag>`` content, else what follows its last ``####``, else its last ``\\boxed{}``,
    else its last number; the final number of that span is compared numerically.
    """

    def extract(self, completion: str) -> str | None:
        for span in (
            extract_tag(completion, self.answer_tag),
            extract_gsm8k_marker(completion),
            extract_boxed(completion),
        ):
            if span is not None:
                return extract_last_number(span)
        return extract_last_number(completion)

    def reference(self, text: str) -> str:
        marked = extract_gsm8k_marker(text)
        return (marked if marked is not None else text).strip()
