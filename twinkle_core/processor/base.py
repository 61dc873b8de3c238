"""The InputProcessor interface: a list of `InputFeature` rows -> model-ready tensors (collation)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class InputProcessor(ABC):
    @abstractmethod
    def __call__(self, rows: list[dict[str, Any]], *, device: Any = None) -> dict[str, Any]:
        """Collate rows: pad (or pack, when padding-free) and shift labels as the Loss contract requires."""
