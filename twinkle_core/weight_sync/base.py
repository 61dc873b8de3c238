"""The CheckpointEngine interface: move weights from a training model to a sampler (docs/architecture.md §5).

An engine is a transport. One `send` on the model side matches one `receive` on each sampler side and carries a
`WeightUpdate`: a small JSON-safe metadata dict (sent first: which adapter, its LoRA config, merged or not) and a
stream of buckets, each labelled `BASE` (Hugging Face names) or `ADAPTER` (PEFT keys). What to send is decided by
`CheckpointEngineManager`; names and buckets are defined in `twinkle_core.weight_sync.weights`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

BASE = 'base'
ADAPTER = 'adapter'
LabelledBucket = tuple[str, list[tuple[str, Any]]]  # (BASE | ADAPTER, [(name, tensor), ...])


@dataclass
class WeightUpdate:
    """What one `send` carried. `buckets` yields (label, bucket) in send order; a streaming engine produces them
    lazily (the receiver holds one bucket at a time), so iterate exactly once and to the end."""

    buckets: Iterable[LabelledBucket]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        """Every (name, tensor) pair, whatever its bucket (consumes the update)."""
        for _, bucket in self.buckets:
            yield from bucket


class CheckpointEngine(ABC):
    @abstractmethod
    def send(self, buckets: Iterable[LabelledBucket], *, metadata: dict[str, Any] | None = None) -> None:
        """Model side: publish `metadata`, then the labelled buckets one by one."""

    @abstractmethod
    def receive(self) -> WeightUpdate:
        """Sampler side: the next update sent (blocks until it arrives for cross-process engines)."""

    def close(self) -> None:
        """Release transport resources (process groups, buffers). Idempotent."""
