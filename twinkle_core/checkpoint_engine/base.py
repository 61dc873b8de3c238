"""The CheckpointEngine interface: move weights from a training model to a sampler (DESIGN §8)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterable


class CheckpointEngine(ABC):
    @abstractmethod
    def send(self, named_tensors: Iterable[tuple[str, Any]], *, lora_only: bool = False) -> None:
        """Called on the model side with (name, tensor) pairs."""

    @abstractmethod
    def receive(self) -> Iterable[tuple[str, Any]]:
        """Called on the sampler side; yields the (name, tensor) pairs sent."""
