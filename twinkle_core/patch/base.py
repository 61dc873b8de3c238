"""The Patch interface: a named, reversible adjustment of a model or library behaviour."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Patch(ABC):
    @abstractmethod
    def apply(self, target: Any, **kwargs: Any) -> Any:
        """Apply to `target` (a model, module or class); return what was patched."""

    def revert(self, target: Any) -> None:  # optional
        raise NotImplementedError(f'{type(self).__name__} cannot be reverted')
