"""Kind `advantage`: the interface, plus lazy access to every registered advantage by name."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.advantage.base import Advantage as Advantage

__getattr__ = kind_getattr('advantage', __name__)
