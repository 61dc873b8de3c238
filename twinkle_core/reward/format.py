"""Format rewards: 1.0 when the completion has the expected shape (e.g. ``<think>..</think><answer>..</answer>``)."""

from __future__ import annotations

import re
from typing import Any, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.reward.answers import NUMBER_PATTERN, completion_text
from twinkle_core.reward.base import Reward


class FormatReward(Reward):
    """1.0 if the whole completion matches `pattern` (``re.fullmatch``, DOTALL), else 0.0.

    Without `pattern` the expected shape is built from the tags: ``<think>...</think>`` (when `think_tag` is not
    None) followed by ``<answer>...</answer>``, surrounding whitespace allowed, where the answer content must match
    `answer_pattern` (default: anything non-empty).
    """

    def __init__(
        self,
        pattern: str | None = None,
        *,
        think_tag: str | None = 'think',
        answer_tag: str = 'answer',
        answer_pattern: str = r'.+?',
    ) -> None:
        if pattern is None:
            think = rf'<{re.escape(think_tag)}>.*?</{re.escape(think_tag)}>\s*' if think_tag else ''
            pattern = rf'\s*{think}<{re.escape(answer_tag)}>\s*(?:{answer_pattern})\s*</{re.escape(answer_tag)}>\s*'
        try:
            self.regex = re.compile(pattern, flags=re.DOTALL)
        except re.error as exc:
            raise InvalidInputError(f'{type(self).__name__}: invalid regex {pattern!r}: {exc}') from exc

    def __call__(self, trajectories: Sequence[dict[str, Any]], **kwargs: Any) -> list[float]:
        who = type(self).__name__
        return [1.0 if self.regex.fullmatch(completion_text(t, i, who)) else 0.0 for i, t in enumerate(trajectories)]


class GSM8KFormatReward(FormatReward):
    """GSM8K format: ``<think>reasoning</think><answer>NUMBER</answer>`` (tags configurable)."""

    def __init__(self, *, think_tag: str | None = 'think', answer_tag: str = 'answer') -> None:
        super().__init__(think_tag=think_tag, answer_tag=answer_tag, answer_pattern=NUMBER_PATTERN)
