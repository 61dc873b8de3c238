"""Kind `optimizer`: lazy access to every registered optimizer by name (torch's own classes are registered too)."""

from twinkle_core._lazy import kind_getattr

__getattr__ = kind_getattr('optimizer', __name__)
