"""The process-wide pluggy PluginManager, loading ``twinkle.hooks`` entry points lazily and fault-tolerantly."""
from __future__ import annotations

import logging
from typing import Any

import pluggy

from twinkle_core.hooks import specs

hook = pluggy.HookimplMarker(specs.PROJECT)
logger = logging.getLogger(__name__)
_pm: pluggy.PluginManager | None = None


def get_plugin_manager() -> pluggy.PluginManager:
    """The manager with every installed ``twinkle.hooks`` implementation. A plugin that fails to load is
    skipped with a warning (one broken plugin never breaks training or the CLI)."""
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager(specs.PROJECT)
        pm.add_hookspecs(specs)
        from twinkle_core import plugins
        for ep in plugins.entry_points_of_group('twinkle.hooks'):
            try:
                obj = ep.load()
                pm.register(obj() if isinstance(obj, type) else obj, name=ep.name)
            except Exception as exc:  # noqa: BLE001
                logger.warning('twinkle hook plugin %r (%s) failed to load: %s', ep.name, ep.value, exc)
        _pm = pm
    return _pm


def register_hooks(obj: Any, name: str | None = None) -> None:
    """Register hook implementations in this process (e.g. a metrics logger in a script)."""
    get_plugin_manager().register(obj, name=name)
