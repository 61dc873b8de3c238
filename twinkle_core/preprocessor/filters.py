"""Built-in row filters for `Dataset.filter`."""

from __future__ import annotations

from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.preprocessor.base import Filter, row_excerpt
from twinkle_core.types import IGNORE_INDEX


class LengthFilter(Filter):
    """Keeps encoded rows with ``min_length <= len(input_ids) <= max_length`` (apply after `Dataset.encode`)."""

    def __init__(self, max_length: int | None = None, min_length: int = 1) -> None:
        if max_length is not None and max_length < min_length:
            raise ValueError(f'max_length={max_length} is smaller than min_length={min_length}.')
        self.max_length, self.min_length = max_length, min_length

    def __call__(self, row: dict[str, Any]) -> bool:
        ids = row.get('input_ids')
        if ids is None:
            raise InvalidInputError(
                'LengthFilter counts tokens: apply it after Dataset.encode() (row has no '
                f"'input_ids'). Row: {row_excerpt(row)}"
            )
        return self.min_length <= len(ids) and (self.max_length is None or len(ids) <= self.max_length)


class LossTokensFilter(Filter):
    """Keeps encoded rows with at least `min_tokens` labelled tokens (e.g. drops rows whose answer was cut off
    by right truncation, which would contribute no loss)."""

    def __init__(self, min_tokens: int = 1) -> None:
        self.min_tokens = min_tokens

    def __call__(self, row: dict[str, Any]) -> bool:
        labels = row.get('labels')
        if labels is None:
            raise InvalidInputError(
                'LossTokensFilter counts labelled tokens: apply it after Dataset.encode() '
                f"(row has no 'labels'). Row: {row_excerpt(row)}"
            )
        return sum(1 for t in labels if t != IGNORE_INDEX) >= self.min_tokens


class MessageLengthFilter(Filter):
    """Keeps trajectories whose total message content has at most `max_chars` characters (before encoding)."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars

    def __call__(self, row: dict[str, Any]) -> bool:
        return sum(len(m.get('content') or '') for m in row.get('messages') or []) <= self.max_chars
