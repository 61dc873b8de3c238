"""Kind `preprocessor`: the interface, plus lazy access to every registered preprocessor by name."""
from twinkle_core._lazy import kind_getattr
from twinkle_core.preprocessor.base import Filter, Preprocessor

__getattr__ = kind_getattr('preprocessor', __name__)
