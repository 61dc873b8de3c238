"""Kind `runtime`: where components live. `initialize(mode=...)` picks one by name."""

from twinkle_core._lazy import kind_getattr
from twinkle_core.runtime.base import Runtime
from twinkle_core.runtime.context import HostedComponentMeta, current_runtime, initialize, shutdown

__all__ = ['HostedComponentMeta', 'Runtime', 'current_runtime', 'initialize', 'shutdown']

__getattr__ = kind_getattr('runtime', __name__)
