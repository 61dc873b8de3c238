"""The Template interface: trajectories <-> token ids, with assistant-only loss labels."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence


class Template(ABC):
    @abstractmethod
    def encode(self, trajectory: Any, *, add_generation_prompt: bool = False) -> dict[str, Any]:
        """A `Trajectory` (or dict) -> an `InputFeature` dict (input_ids, labels with -100 outside the loss)."""

    @abstractmethod
    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        """Token ids -> text."""

    def encode_batch(self, trajectories: Sequence[Any], *, add_generation_prompt: bool = False) -> list[dict[str, Any]]:
        """`encode` applied to each trajectory, in order."""
        return [self.encode(t, add_generation_prompt=add_generation_prompt) for t in trajectories]

    def fingerprint(self) -> str | None:
        """A stable digest of everything that changes `encode`'s output (tokenizer, chat template, options).

        `Dataset.encode` uses it as the cache key of encoded data; None lets `datasets` hash the object itself.
        """
        return None
