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
    'ComponentNotFoundError', 'DeviceGroup', 'DeviceMesh', 'InvalidInputError', 'TwinkleError', '__version__',
    'current_runtime', 'initialize', 'list_components', 'register', 'resolve', 'resolve_class', 'shutdown',
]
