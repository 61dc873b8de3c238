"""Kind `model`: the interface, plus lazy access to every registered model by name."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.model.base import Model, ModelCapabilities

TwinkleModel = Model  # the Twinkle documents' name of the interface

__all__ = ['Model', 'ModelCapabilities', 'TwinkleModel']

__getattr__ = kind_getattr('model', __name__)
