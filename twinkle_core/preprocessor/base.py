"""Preprocessors map raw dataset rows to the standard `Trajectory` format (in `Dataset.map`, before tokenization);
Filters keep or drop rows. Batches of encoded rows become tensors later, by a `processor` (`twinkle_core.processor`)."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable

from twinkle_core.errors import InvalidInputError


class Preprocessor(ABC):
    """One raw row -> one `Trajectory` dict (``{'messages': [...], **extra per-row fields}``).

    Implementations raise `InvalidInputError` naming the missing field(s); `Dataset.map` adds the row index.
    """

    @abstractmethod
    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        """One raw row -> one `Trajectory` dict. Raise `InvalidInputError` naming the missing field."""

    @classmethod
    def from_callable(cls, fn: Callable[[dict[str, Any]], dict[str, Any]], **init_args: Any) -> Preprocessor:
        return _CallablePreprocessor(fn, init_args)


class Filter(ABC):
    """A row predicate for `Dataset.filter`: True keeps the row."""

    @abstractmethod
    def __call__(self, row: dict[str, Any]) -> bool:
        """True keeps the row."""

    @classmethod
    def from_callable(cls, fn: Callable[..., bool], **init_args: Any) -> Filter:
        return _CallableFilter(fn, init_args)


class _CallablePreprocessor(Preprocessor):
    def __init__(self, fn: Callable[..., dict[str, Any]], init_args: dict[str, Any]) -> None:
        self.fn, self.init_args = fn, init_args

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return self.fn(row, **self.init_args)

    def __repr__(self) -> str:
        return f'Preprocessor.from_callable({getattr(self.fn, "__qualname__", self.fn)!r})'


class _CallableFilter(Filter):
    def __init__(self, fn: Callable[..., bool], init_args: dict[str, Any]) -> None:
        self.fn, self.init_args = fn, init_args

    def __call__(self, row: dict[str, Any]) -> bool:
        return bool(self.fn(row, **self.init_args))

    def __repr__(self) -> str:
        return f'Filter.from_callable({getattr(self.fn, "__qualname__", self.fn)!r})'


def row_excerpt(row: dict[str, Any], limit: int = 160) -> str:
    """A short, single-line rendering of a row for error messages."""
    try:
        text = json.dumps(row, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(row)
    return text if len(text) <= limit else text[:limit] + '...'


def require_fields(row: dict[str, Any], fields: Iterable[str], who: str, *, hint: str = '') -> None:
    """Raise `InvalidInputError` if any of `fields` is absent or None in `row`, naming all of them."""
    missing = [f for f in fields if row.get(f) is None]
    if missing:
        names = ', '.join(repr(f) for f in missing)
        raise InvalidInputError(
            f'{who}: row is missing field(s) {names}; it has {sorted(row)}. Row: {row_excerpt(row)}'
            + (f' {hint}' if hint else '')
        )
