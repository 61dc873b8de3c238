"""The Kernel interface: an optimised implementation that replaces a module or function on a model."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Kernel(ABC):
    @abstractmethod
    def is_available(self, device_type: str) -> bool:
        """Whether this kernel can run on `device_type` ('cpu', 'cuda', ...)."""

    @abstractmethod
    def apply(self, model: Any) -> int:
        """Install into `model`; returns how many modules were replaced."""
