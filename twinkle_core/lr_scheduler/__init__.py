"""Kind `lr_scheduler`: lazy access to every registered lr_scheduler by name (torch's own classes are registered
too)."""

from twinkle_core._lazy import kind_getattr

__getattr__ = kind_getattr('lr_scheduler', __name__)
