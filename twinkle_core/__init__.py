"""twinkle_core: interfaces, registry and data formats for LLM post-training. Plugins provide the rest.

Importing this package is cheap: no torch, no plugin is imported until a component is asked for by name.
"""

from __future__ import annotations

from twinkle_core.errors import ComponentNotFoundError, InvalidInputError, TwinkleError
from twinkle_core.mesh import DeviceGroup, DeviceMesh
from twinkle_core.registry import list_components, register, resolve, resolve_class
from twinkle_core.runtime.context import current_runtime, initialize, shutdown

__version__ = '0.1.0'

__all__ = [
    'ComponentNotFoundError',
    'DeviceGroup',
    'DeviceMesh',
    'DingNotifier',
    'InvalidInputError',
    'TwinkleError',
    'WebhookNotifier',
    '__version__',
    'current_runtime',
    'get_device_placement',
    'get_logger',
    'init_tinker_client',
    'initialize',
    'list_components',
    'register',
    'resolve',
    'resolve_class',
    'shutdown',
]

# names the Twinkle documents import from the package root (twinkle_core.compat), loaded on first use
_LAZY = {
    'get_logger': 'twinkle_core.compat.helpers',
    'get_device_placement': 'twinkle_core.compat.helpers',
    'init_tinker_client': 'twinkle_core.compat.tinker',
    'DingNotifier': 'twinkle_core.compat.helpers',
    'WebhookNotifier': 'twinkle_core.hooks.notifier',
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
