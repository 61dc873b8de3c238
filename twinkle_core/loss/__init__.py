"""Kind `loss`: the interface, plus lazy access to every registered loss by name."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.loss.base import Loss as Loss
from twinkle_core.loss.base import LossOutput as LossOutput

__getattr__ = kind_getattr('loss', __name__)
