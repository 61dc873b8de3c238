"""Entry-point discovery. Reads distribution metadata only; imports a plugin module when its name is asked for.

One broken plugin never breaks discovery: a failing import raises `PluginLoadError` naming the entry point and
its distribution, for that name alone.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib import metadata
from typing import Any

from twinkle_core.errors import PluginLoadError

GROUP_PREFIX = 'twinkle.'


def entry_points_of(kind: str) -> tuple[metadata.EntryPoint, ...]:
    """Entry points of group ``twinkle.<kind>`` (metadata only, nothing imported), sorted by name."""
    return entry_points_of_group(GROUP_PREFIX + kind)


@cache
def entry_points_of_group(group: str) -> tuple[metadata.EntryPoint, ...]:
    return tuple(sorted(metadata.entry_points(group=group), key=lambda ep: ep.name))


def find_entry_point(kind: str, name: str) -> metadata.EntryPoint | None:
    for ep in entry_points_of(kind):
        if ep.name == name:
            return ep
    return None


_loaded: dict[tuple[str, str], Any] = {}


def load_entry_point(kind: str, ep: metadata.EntryPoint) -> Any:
    key = (kind, ep.value)
    if key not in _loaded:
        try:
            _loaded[key] = ep.load()
        except Exception as exc:  # noqa: BLE001 - re-raised with context
            raise PluginLoadError(
                f'Plugin {kind} {ep.name!r} ({ep.value}) from distribution {distribution_of(ep)!r} failed to '
                f'import: {type(exc).__name__}: {exc}'
            ) from exc
    return _loaded[key]


def distribution_of(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, 'dist', None)
    return dist.metadata['Name'] if dist is not None else '?'


def import_target(target: str) -> Any:
    """Import ``"package.module:attr"`` (attr may be dotted)."""
    module_name, _, attr = target.partition(':')
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attr.split('.')):
        obj = getattr(obj, part)
    return obj


def refresh() -> None:
    """Forget cached metadata, e.g. after ``pip install`` of a plugin in this process.

    Hook plugins (``twinkle.hooks``) are discovered once per process; `twinkle_core.hooks.reset_plugin_manager()`
    re-discovers them (dropping hooks registered in this process)."""
    entry_points_of_group.cache_clear()
    importlib.invalidate_caches()
    try:
        metadata.distributions.cache_clear()  # type: ignore[attr-defined]
    except AttributeError:
        pass
