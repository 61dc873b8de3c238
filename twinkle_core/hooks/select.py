"""Choosing metrics loggers by name: ``initialize(loggers=['wandb', {'name': 'jsonl', 'path': ...}])``.

A logger's name is its ``twinkle.hooks`` entry point without the ``_metrics`` suffix (``console``, ``jsonl``,
``tensorboard``, ``wandb``, ``swanlab``, and any plugin's ``<name>_metrics``). A spec is a name, a mapping with
``name`` plus the logger's constructor arguments, or a ready object implementing ``twinkle_metrics``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from twinkle_core.hooks.manager import get_plugin_manager

SUFFIX = '_metrics'

__all__ = ['build_logger', 'install_loggers', 'logger_names']


def logger_names() -> list[str]:
    """Names of the installed metrics loggers (``twinkle.hooks`` entry points named ``<name>_metrics``)."""
    from twinkle_core import plugins

    return [
        ep.name[: -len(SUFFIX)] for ep in plugins.entry_points_of_group('twinkle.hooks') if ep.name.endswith(SUFFIX)
    ]


def build_logger(spec: str | Mapping[str, Any] | Any) -> Any:
    """A logger instance for `spec` (see the module docstring). Raises ValueError naming the installed loggers
    for an unknown name."""
    if not isinstance(spec, (str, Mapping)):
        if not callable(getattr(spec, 'twinkle_metrics', None)):
            raise TypeError(f'a logger must be a name, a mapping with "name", or implement twinkle_metrics: {spec!r}')
        return spec
    args = {'name': spec} if isinstance(spec, str) else dict(spec)
    name = str(args.pop('name', '')).removesuffix(SUFFIX)
    from twinkle_core import plugins

    for ep in plugins.entry_points_of_group('twinkle.hooks'):
        if ep.name == name + SUFFIX:
            return ep.load()(**args)
    raise ValueError(f'unknown metrics logger {name!r}; installed: {", ".join(logger_names()) or "none"}')


def install_loggers(specs: Iterable[str | Mapping[str, Any] | Any]) -> list[Any]:
    """Build each logger of `specs` and register it in this process, in place of the unconfigured instance that
    its entry point registered (so it does not log twice). Returns the registered loggers (``close()`` them, if
    they have one, when the run ends)."""
    pm = get_plugin_manager()
    built: list[Any] = []
    names: set[str] = set()
    for spec in specs:
        obj = build_logger(spec)
        name = _entry_name(spec)
        if name is not None and name in names:  # a second logger of one kind (e.g. two JSONL files)
            name = f'{name}#{len(built)}'
        elif name is not None and pm.get_plugin(name) is not None:
            pm.unregister(name=name)
        pm.register(obj, name=name)
        names.add(name or '')
        built.append(obj)
    return built


def _entry_name(spec: Any) -> str | None:
    if isinstance(spec, str):
        return spec.removesuffix(SUFFIX) + SUFFIX
    if isinstance(spec, Mapping):
        return str(spec.get('name', '')).removesuffix(SUFFIX) + SUFFIX
    return None
