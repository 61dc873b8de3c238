"""Kind `processor`: the interface, plus lazy access to every registered processor by name."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.processor.base import InputProcessor

__all__ = ['InputProcessor']

__getattr__ = kind_getattr('processor', __name__)
