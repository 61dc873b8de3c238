"""Kind `kernel`: the interface, plus lazy access to every registered kernel by name."""
from twinkle_core._lazy import kind_getattr
from twinkle_core.kernel.base import Kernel

__all__ = ['Kernel']

__getattr__ = kind_getattr('kernel', __name__)
