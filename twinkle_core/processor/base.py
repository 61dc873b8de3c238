"""The InputProcessor interface: a list of encoded `InputFeature` rows -> model-ready tensors (collation, inside the
model). Raw dataset rows are mapped earlier, by a `preprocessor` (`twinkle_core.preprocessor`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class InputProcessor(ABC):
    @abstractmethod
    def __call__(self, rows: list[dict[str, Any]], *, device: Any = None) -> dict[str, Any]:
        """Collate rows: pad (or pack, when padding-free) and shift labels as the Loss contract requires."""
