"""Kind `patch`: the interface, plus lazy access to every registered patch by name."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.patch.base import Patch

__all__ = ['Patch']

__getattr__ = kind_getattr('patch', __name__)
