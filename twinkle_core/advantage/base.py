"""The Advantage interface: rewards of a batch of completions -> one advantage (or per-token list) per completion."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence


class Advantages(list[float]):
    """One advantage per completion (a list); ``tolist()`` returns a plain copy, as a tensor or array would."""

    def tolist(self) -> list[float]:
        return list(self)


def group_size_of(group_size: int | None, num_generations: int | None, who: str) -> int:
    """The group size, given as ``group_size=`` or (the Twinkle documents' spelling) ``num_generations=``."""
    if group_size is not None and num_generations is None:
        return group_size
    if num_generations is not None and group_size is None:
        return num_generations
    raise TypeError(
        f'{who}() takes the number of completions per prompt as group_size= (or num_generations=), '
        f'exactly once ({"both" if group_size is not None else "neither"} given).'
    )


class Advantage(ABC):
    @abstractmethod
    def __call__(
        self, rewards: Sequence[float], *, group_size: int | None = None, num_generations: int | None = None
    ) -> list[Any]:
        """`rewards` are ordered group by group (`group_size` completions per prompt, also spelled
        ``num_generations=``, exactly one of the two); returns len(rewards) advantages: a float per completion, or
        (per-token estimators such as `GAEAdvantage`) a list of floats per completion. Implementations may take
        further optional keywords (e.g. `GRPOAdvantage`'s ``scale=``)."""

    @classmethod
    def from_callable(cls, fn: Callable[..., list[float]], **init_args: Any) -> Advantage:
        return _CallableAdvantage(fn, init_args)


class _CallableAdvantage(Advantage):
    def __init__(self, fn: Callable[..., list[float]], init_args: dict[str, Any]) -> None:
        self.fn, self.init_args = fn, init_args

    def __call__(
        self,
        rewards: Sequence[float],
        *,
        group_size: int | None = None,
        num_generations: int | None = None,
        **kwargs: Any,
    ) -> list[float]:
        size = group_size_of(group_size, num_generations, getattr(self.fn, '__name__', 'Advantage'))
        return list(self.fn(rewards, group_size=size, **{**self.init_args, **kwargs}))
