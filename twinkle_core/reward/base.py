"""The Reward interface: completed trajectories -> one float each."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence


class Reward(ABC):
    @abstractmethod
    def __call__(self, trajectories: Sequence[dict[str, Any]], **kwargs: Any) -> list[float]:
        """Score each trajectory (a `Trajectory` dict whose last message is the completion)."""

    @classmethod
    def from_callable(cls, fn: Callable[..., Sequence[float]], **init_args: Any) -> Reward:
        return _CallableReward(fn, init_args)


class _CallableReward(Reward):
    def __init__(self, fn: Callable[..., Sequence[float]], init_args: dict[str, Any]) -> None:
        self.fn, self.init_args = fn, init_args

    def __call__(self, trajectories: Sequence[dict[str, Any]], **kwargs: Any) -> list[float]:
        return [float(x) for x in self.fn(trajectories, **{**self.init_args, **kwargs})]
