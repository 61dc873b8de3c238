"""Preprocessors map raw dataset rows to the standard `Trajectory` format; Filters keep or drop rows."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable


class Preprocessor(ABC):
    @abstractmethod
    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        """One raw row -> one `Trajectory` dict. Raise `InvalidInputError` naming the missing field."""

    @classmethod
    def from_callable(cls, fn: Callable[[dict[str, Any]], dict[str, Any]], **init_args: Any) -> 'Preprocessor':
        return _CallablePreprocessor(fn, init_args)


class Filter(ABC):
    @abstractmethod
    def __call__(self, row: dict[str, Any]) -> bool:
        """True keeps the row."""


class _CallablePreprocessor(Preprocessor):
    def __init__(self, fn: Callable[..., dict[str, Any]], init_args: dict[str, Any]) -> None:
        self.fn, self.init_args = fn, init_args

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return self.fn(row, **self.init_args)
