"""The process-wide pluggy PluginManager, loading ``twinkle.hooks`` entry points lazily and fault-tolerantly."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pluggy

from twinkle_core.hooks import specs

hook = pluggy.HookimplMarker(specs.PROJECT)
logger = logging.getLogger(__name__)
_pm: pluggy.PluginManager | None = None
_failed: dict[str, str] = {}  # entry-point name -> why it failed to load
_lock = threading.RLock()


def get_plugin_manager() -> pluggy.PluginManager:
    """The manager with every installed ``twinkle.hooks`` implementation, built on first use.

    An entry point may name a class (instantiated with no arguments), an instance or a module. One that fails
    to load is skipped with a warning and listed by `failed_hook_plugins()` (one broken plugin never breaks
    training or the CLI).
    """
    global _pm
    if _pm is not None:
        return _pm
    with _lock:
        if _pm is not None:
            return _pm
        pm = pluggy.PluginManager(specs.PROJECT)
        pm.add_hookspecs(specs)
        from twinkle_core import plugins

        for ep in plugins.entry_points_of_group('twinkle.hooks'):
            try:
                obj = ep.load()
                pm.register(obj() if isinstance(obj, type) else obj, name=ep.name)
            except Exception as exc:  # noqa: BLE001
                _failed[ep.name] = f'{ep.value} from {plugins.distribution_of(ep)!r}: {type(exc).__name__}: {exc}'
                logger.warning('twinkle hook plugin %r (%s) failed to load and is skipped: %s', ep.name, ep.value, exc)
        _pm = pm
    return _pm


def register_hooks(obj: Any, name: str | None = None) -> None:
    """Register hook implementations in this process (e.g. a metrics logger in a script)."""
    get_plugin_manager().register(obj, name=name)


def unregister_hooks(obj: Any = None, name: str | None = None) -> None:
    """Remove implementations registered with `register_hooks` (by object or name)."""
    get_plugin_manager().unregister(plugin=obj, name=name)


def failed_hook_plugins() -> dict[str, str]:
    """``twinkle.hooks`` entry points that failed to load: name -> reason."""
    get_plugin_manager()
    return dict(_failed)


def reset_plugin_manager() -> None:
    """Drop the manager (and every registration); the next hook call re-discovers entry points."""
    global _pm
    with _lock:
        _pm = None
        _failed.clear()


def call_each(hook_name: str, **kwargs: Any) -> list[Any]:
    """Call every implementation of `hook_name` with `kwargs`; an implementation that raises is logged and
    skipped, the others still run. Returns the non-None results."""
    caller = getattr(get_plugin_manager().hook, hook_name)
    results = []
    for impl in reversed(caller.get_hookimpls()):  # pluggy's order: last registered first
        try:
            result = impl.function(*[kwargs[a] for a in impl.argnames])
        except Exception as exc:  # noqa: BLE001
            logger.warning(
                'twinkle hook %s of plugin %r raised and is skipped: %s: %s',
                hook_name,
                impl.plugin_name,
                type(exc).__name__,
                exc,
            )
            continue
        if result is not None:
            results.append(result)
    return results
