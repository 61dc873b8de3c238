"""The server's configuration, in one package; each module says what it is:

- `settings`: `ServerConfig` (the `server` and `storage` sections) and `TenantLimits` (`limits`);
- `model_settings`: `ModelSpec` (a `models` entry), `GroupSpec`, `HubPushConfig`, `DeploymentConfig`, `RayConfig`;
- `options`: how a settings field declares its config key (default, rule, meaning, flag) once;
- `rules`: what a value must be (`Rule`) and the named values rules check against;
- `schema`: the known keys of each section, from the declarations;
- `flags`: the `twinkle server start` flags of declared keys;
- `loading`: loading a config file -> a checked `ServerConfig` (`load_server_config`, `load_storage`, `describe`);
- `yaml_lines`: YAML read with the line of every key, ``${VAR}`` expansion, command-line overrides, `ConfigError`.

Everything is importable from here (``from twinkle_server.config import ServerConfig, load_server_config``); the
loading names are imported on first use, so importing the settings stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from twinkle_server.config.model_settings import DeploymentConfig, GroupSpec, HubPushConfig, ModelSpec, RayConfig
from twinkle_server.config.rules import DEVICE_TYPES, HUBS, MESH_KEYS, is_ip_or_network
from twinkle_server.config.settings import ServerConfig, TenantLimits

_LAZY = {
    'ConfigError': 'twinkle_server.config.yaml_lines',
    'describe': 'twinkle_server.config.loading',
    'load_server_config': 'twinkle_server.config.loading',
    'load_storage': 'twinkle_server.config.loading',
}

__all__ = [
    'DEVICE_TYPES',
    'HUBS',
    'MESH_KEYS',
    'ConfigError',
    'DeploymentConfig',
    'GroupSpec',
    'HubPushConfig',
    'ModelSpec',
    'RayConfig',
    'ServerConfig',
    'TenantLimits',
    'describe',
    'is_ip_or_network',
    'load_server_config',
    'load_storage',
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
