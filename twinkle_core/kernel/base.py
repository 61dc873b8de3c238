"""The Kernel interface: a named, optimised implementation of part of a model, installed by `apply_kernels`.

Every kernel reports how many modules it replaced; a kernel that replaces nothing is an error, never a silent
no-op. `mode` is 'training' (gradients flow through it) or 'inference'.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Literal

KernelMode = Literal['training', 'inference']
MODES: tuple[str, ...] = ('training', 'inference')


class Kernel(ABC):
    #: the name it is asked for by (registry name, or the layer name of a hub kernel)
    name: str

    @abstractmethod
    def is_available(self, device_type: str) -> bool:
        """Whether this kernel can run on `device_type` ('cpu', 'cuda', ...)."""

    @abstractmethod
    def apply(self, model: Any, *, mode: KernelMode = 'training', device: str = 'cpu') -> int:
        """Install into `model` (a torch module); returns how many modules were replaced."""
