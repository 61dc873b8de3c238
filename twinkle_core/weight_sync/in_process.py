"""`InProcessCheckpointEngine`: model and sampler in one process; tensors are handed over by reference (no copy,
no serialisation). The receiver copies them into its own parameters (or skips that when it shares them)."""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable

from twinkle_core.errors import TwinkleError
from twinkle_core.weight_sync.base import CheckpointEngine, LabelledBucket, WeightUpdate


class InProcessCheckpointEngine(CheckpointEngine):
    """A FIFO of updates: each `send` is delivered by exactly one later `receive`."""

    def __init__(self) -> None:
        self._pending: deque[WeightUpdate] = deque()

    def send(self, buckets: Iterable[LabelledBucket], *, metadata: dict[str, Any] | None = None) -> None:
        self._pending.append(WeightUpdate([(label, list(b)) for label, b in buckets], dict(metadata or {})))

    def receive(self) -> WeightUpdate:
        if not self._pending:
            raise TwinkleError('InProcessCheckpointEngine.receive(): nothing was sent; call send() first.')
        return self._pending.popleft()
