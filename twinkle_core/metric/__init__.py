"""Kind `metric`: the interface, plus lazy access to every registered metric by name."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.metric.base import Metric

__all__ = ['Metric']

__getattr__ = kind_getattr('metric', __name__)
