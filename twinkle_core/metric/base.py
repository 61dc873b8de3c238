"""The Metric interface: accumulate over steps, report and reset."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Metric(ABC):
    @abstractmethod
    def accumulate(self, inputs: dict[str, Any], outputs: dict[str, Any], **kwargs: Any) -> None:
        """Fold one batch (collated inputs and forward/loss outputs) into the running state."""

    @abstractmethod
    def calculate(self) -> dict[str, float]:
        """The metric values since the last `reset`."""

    @abstractmethod
    def reset(self) -> None:
        """Start a new accumulation window."""
