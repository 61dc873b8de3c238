"""Kind `sampler`: the interface, plus lazy access to every registered sampler by name."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.sampler.base import Sampler, SamplerCapabilities

__all__ = ['Sampler', 'SamplerCapabilities']

__getattr__ = kind_getattr('sampler', __name__)
