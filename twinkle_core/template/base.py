"""The Template interface: trajectories <-> token ids, with assistant-only loss labels."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Template(ABC):
    @abstractmethod
    def encode(self, trajectory: Any, *, add_generation_prompt: bool = False) -> dict[str, Any]:
        """A `Trajectory` (or dict) -> an `InputFeature` dict (input_ids, labels with -100 outside the loss)."""

    @abstractmethod
    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        """Token ids -> text."""
