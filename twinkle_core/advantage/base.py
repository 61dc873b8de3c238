"""The Advantage interface: rewards of a batch of completions -> one advantage per completion."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence


class Advantage(ABC):
    @abstractmethod
    def __call__(self, rewards: Sequence[float], *, group_size: int, **kwargs: Any) -> list[float]:
        """`rewards` are ordered group by group (`group_size` completions per prompt); returns len(rewards)."""

    @classmethod
    def from_callable(cls, fn: Callable[..., list[float]], **init_args: Any) -> 'Advantage':
        return _CallableAdvantage(fn, init_args)


class _CallableAdvantage(Advantage):
    def __init__(self, fn: Callable[..., list[float]], init_args: dict[str, Any]) -> None:
        self.fn, self.init_args = fn, init_args

    def __call__(self, rewards: Sequence[float], *, group_size: int, **kwargs: Any) -> list[float]:
        return list(self.fn(rewards, group_size=group_size, **{**self.init_args, **kwargs}))
