"""Kind `reward`: the interface, plus lazy access to every registered reward by name."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.reward.base import Reward as Reward

__getattr__ = kind_getattr('reward', __name__)
