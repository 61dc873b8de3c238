"""How a name becomes a component.

`resolve(kind, spec, **init_args)` accepts an instance (returned as is), a class or callable (instantiated, or
wrapped by the kind's interface when it is a plain function), or a string. Strings resolve in this order, first
hit wins (docs/architecture.md §1):

1. names registered in this process with `@register(kind)`;
2. installed entry points of group ``twinkle.<kind>`` -- loaded lazily, only the one asked for;
3. the curated ``registry/`` index, which says where a known name lives (a pip distribution or a pinned hub repo);
4. hub references ``ms://org/repo[@rev][:Name]`` / ``hf://...``.

An unknown name raises `ComponentNotFoundError`, listing close matches and every provider of that kind.

The kinds and their interfaces are `twinkle_core.kinds`. Hub references -- given (4.) or pinned by an index entry
(3.) -- are loaded here, through `twinkle_core.hub.loader`; the index only says where a name lives.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from twinkle_core import plugins, registry_index
from twinkle_core.errors import ComponentNotFoundError, TwinkleError
from twinkle_core.hub import loader as hub_loader
from twinkle_core.kinds import KIND_INTERFACES, KINDS, check_kind

__all__ = [
    'KINDS',
    'KIND_INTERFACES',
    'ComponentInfo',
    'check_kind',
    'list_components',
    'load_hub_reference',
    'register',
    'resolve',
    'resolve_class',
    'unregister',
]

_T = TypeVar('_T')
_local: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
_HUB_SCHEMES = ('ms://', 'hf://')


@dataclass(frozen=True)
class ComponentInfo:
    """One resolvable name: its kind, where it comes from and the distribution (or hub repo) providing it."""

    name: str
    kind: str
    provider: str
    source: str  # 'process' | 'entry_point' | 'index'
    target: str = ''  # "module:attr" for entry points, a hub ref or pip line for the index


def register(kind: str, name: str | None = None, *, override: bool = False) -> Callable[[_T], _T]:
    """Register a class or callable under `name` (default: its ``__name__``) in this process only.

    Meant for notebooks and tests; packages register through entry points instead. Registering a name twice
    raises unless ``override=True``.
    """
    check_kind(kind)

    def decorator(obj: _T) -> _T:
        key = name or getattr(obj, '__name__', None)
        if not key:
            raise TwinkleError(f'Cannot register {obj!r} for kind {kind!r} without a name.')
        if key in _local[kind] and not override and _local[kind][key] is not obj:
            raise TwinkleError(f'{kind} {key!r} is already registered in this process; pass override=True.')
        _local[kind][key] = obj
        return obj

    return decorator


def unregister(kind: str, name: str) -> None:
    """Remove a name registered with `register` (no-op when absent)."""
    check_kind(kind)
    _local[kind].pop(name, None)


def resolve_class(kind: str, name: str, *, trust_remote_code: bool | None = None) -> Any:
    """Return the class or callable that `name` stands for, without instantiating it."""
    check_kind(kind)
    if not isinstance(name, str) or not name:
        raise TwinkleError(f'A {kind} name must be a non-empty string, got {name!r}.')
    if name.startswith(_HUB_SCHEMES):
        return load_hub_reference(kind, name, trust_remote_code=trust_remote_code)
    if name in _local[kind]:
        return _local[kind][name]
    entry = plugins.find_entry_point(kind, name)
    if entry is not None:
        return plugins.load_entry_point(kind, entry)
    indexed = registry_index.lookup(kind, name)
    if indexed is not None:
        if indexed.hub_reference is None:  # a distribution that should have registered the name: say what to do
            raise indexed.unavailable_error()
        return load_hub_reference(kind, indexed.hub_reference, trust_remote_code=trust_remote_code)
    raise ComponentNotFoundError(_not_found_message(kind, name))


def load_hub_reference(kind: str, ref: str, *, trust_remote_code: bool | None = None) -> Any:
    """The class or callable of `kind` that the hub reference `ref` names (given by the caller, or the pinned
    reference of an index entry): loaded by `twinkle_core.hub.loader` (trust check, download, verification)."""
    return hub_loader.load_hub_component(kind, ref, trust_remote_code=trust_remote_code)


def resolve(kind: str, spec: Any, /, **init_args: Any) -> Any:
    """Turn `spec` (instance | class | callable | name) into a ready component of `kind`.

    ``trust_remote_code`` in `init_args` is consumed here (hub references) and not passed on.
    """
    check_kind(kind)
    trust = init_args.pop('trust_remote_code', None)
    if isinstance(spec, str):
        spec = resolve_class(kind, spec, trust_remote_code=trust)
    if inspect.isclass(spec):
        return spec(**init_args)
    if inspect.isfunction(spec) or inspect.ismethod(spec) or inspect.isbuiltin(spec):
        interface = _interface(kind)
        if interface is not None and hasattr(interface, 'from_callable'):
            return interface.from_callable(spec, **init_args)
        return spec(**init_args) if init_args else spec
    if init_args:
        raise TwinkleError(f'{kind} {spec!r} is already an instance; it takes no init args (got {sorted(init_args)}).')
    return spec


def list_components(kind: str | None = None) -> list[ComponentInfo]:
    """Every resolvable name (of one kind, or all), process registrations first, then entry points, then index."""
    kinds = [kind] if kind else list(KINDS)
    out: list[ComponentInfo] = []
    for k in kinds:
        check_kind(k)
        seen: set[str] = set()
        for name, obj in sorted(_local[k].items()):
            out.append(ComponentInfo(name, k, getattr(obj, '__module__', '?'), 'process'))
            seen.add(name)
        for ep in plugins.entry_points_of(k):
            if ep.name not in seen:
                out.append(ComponentInfo(ep.name, k, plugins.distribution_of(ep), 'entry_point', ep.value))
                seen.add(ep.name)
        for item in registry_index.entries(k):
            if item.name not in seen:
                out.append(ComponentInfo(item.name, k, item.provider, 'index', item.target))
                seen.add(item.name)
    return out


def _interface(kind: str) -> type | None:
    target = KIND_INTERFACES.get(kind)
    return plugins.import_target(target) if target else None


def _not_found_message(kind: str, name: str) -> str:
    known = list_components(kind)
    names = [c.name for c in known]
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    lines = [f'No {kind} named {name!r}.']
    if close:
        lines.append(f'Did you mean: {", ".join(close)}?')
    installed = [c for c in known if c.source != 'index']
    indexed = [c for c in known if c.source == 'index']
    if installed:
        providers: dict[str, list[str]] = {}
        for c in installed:
            providers.setdefault(c.provider, []).append(c.name)
        lines.append(f'Installed providers of kind {kind!r}:')
        lines += [f'  {prov}: {", ".join(sorted(ns))}' for prov, ns in sorted(providers.items())]
    else:
        lines.append(f'No provider of kind {kind!r} is installed.')
    if indexed:
        lines.append('Also known to the registry/ index (installable):')
        lines += [f'  {c.name}: {c.target}' for c in indexed]
    lines.append(
        f'Register one with @register({kind!r}), an entry point in group "twinkle.{kind}", '
        f'or a hub reference such as "ms://org/repo:Name".'
    )
    return '\n'.join(lines)
