"""The CheckpointEngine interface: move weights from a training model to a sampler (docs/architecture.md §5).

An engine is a transport. One `send` on the model side matches one `receive` on each sampler side and carries a
`WeightUpdate`: (name, tensor) pairs plus a small JSON-safe metadata dict (e.g. which adapter the LoRA tensors
belong to and its LoRA config). What to send -- everything, LoRA only, merged weights -- is decided by
`CheckpointEngineManager`; how tensor names are spelled is fixed in `twinkle_core.checkpoint_engine.weights`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator


@dataclass
class WeightUpdate:
    """What one `send` carried. Iterating yields the (name, tensor) pairs in send order; a streaming engine may
    produce them lazily, so iterate it exactly once and to the end."""
    named_tensors: Iterable[tuple[str, Any]]
    lora_only: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.named_tensors)


class CheckpointEngine(ABC):
    @abstractmethod
    def send(self, named_tensors: Iterable[tuple[str, Any]], *, lora_only: bool = False,
             metadata: dict[str, Any] | None = None) -> None:
        """Model side: publish (name, tensor) pairs. `lora_only` tells receivers that base weights are absent."""

    @abstractmethod
    def receive(self) -> WeightUpdate:
        """Sampler side: the next update sent (blocks until it arrives for cross-process engines)."""

    def close(self) -> None:
        """Release transport resources (process groups, buffers). Idempotent."""
