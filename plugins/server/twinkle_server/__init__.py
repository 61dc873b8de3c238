"""twinkle-server: a multi-tenant LoRA training service with a Tinker-compatible API and the native twinkle API.

    from twinkle_server import ServerConfig, serve
    serve(ServerConfig(models={'Qwen/Qwen3-0.6B': '/models/qwen3'}, data_dir='./data'))

Names are imported lazily, so loading the `twinkle server` CLI hook stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    'ServerConfig': 'twinkle_server.config',
    'TenantLimits': 'twinkle_server.config',
    'create_app': 'twinkle_server.app',
    'serve': 'twinkle_server.launch',
    'start_in_thread': 'twinkle_server.launch',
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
