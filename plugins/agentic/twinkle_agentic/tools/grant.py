"""What a sandboxed tool may reach beyond its sandbox: only what the tool declares, read from three optional
attributes of the tool (class or instance):

- ``network: bool`` -- the host's network (its network namespace is shared, plus the /etc files that name
  resolution and TLS read). Default False: the call has its own network namespace with only a loopback of its own.
- ``paths: Sequence[str | tuple[str, str]]`` -- host paths bound at the same place in the sandbox: ``'/data'`` or
  ``('/data', 'ro')`` read-only, ``('/out', 'rw')`` read-write. Default none.
- ``env: Sequence[str]`` -- names of variables copied from this process's environment when set. Default none.

`grant_of` reads and checks them (a malformed declaration raises `TwinkleError` naming the tool).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from twinkle_core.errors import TwinkleError

__all__ = ['Grant', 'grant_of']

_MODES = ('ro', 'rw')


@dataclass(frozen=True)
class Grant:
    """A tool's declared access: `network`; absolute host paths `read_only` and `read_write`; `env` names."""

    network: bool = False
    read_only: tuple[str, ...] = ()
    read_write: tuple[str, ...] = ()
    env: tuple[str, ...] = ()


def grant_of(tool: Any) -> Grant:
    """The `Grant` declared by `tool`'s ``network``, ``paths`` and ``env`` attributes (see the module docstring)."""
    name = getattr(tool, 'name', repr(tool))
    network = getattr(tool, 'network', False)
    if not isinstance(network, bool):
        raise TwinkleError(f'tool {name!r}: network must be True or False, got {network!r}')
    read_only: list[str] = []
    read_write: list[str] = []
    for entry in _sequence(name, 'paths', getattr(tool, 'paths', ())):
        path, mode = (entry, 'ro') if isinstance(entry, str) else tuple(entry) if _is_pair(entry) else (None, None)
        if not isinstance(path, str) or mode not in _MODES:
            raise TwinkleError(f"tool {name!r}: each of paths must be 'PATH' or ('PATH', 'ro' | 'rw'), got {entry!r}")
        if not os.path.isabs(path):
            raise TwinkleError(f'tool {name!r}: path {path!r} must be absolute')
        if not os.path.exists(path):
            raise TwinkleError(f'tool {name!r}: path {path!r} does not exist on this host')
        (read_only if mode == 'ro' else read_write).append(os.path.normpath(path))
    env = _sequence(name, 'env', getattr(tool, 'env', ()))
    if not all(isinstance(n, str) and n and '=' not in n for n in env):
        raise TwinkleError(f'tool {name!r}: env must list variable names, got {env!r}')
    return Grant(network, tuple(read_only), tuple(read_write), tuple(env))


def _sequence(name: str, field: str, value: Any) -> tuple[Any, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise TwinkleError(f'tool {name!r}: {field} must be a list, got {value!r}')
    return tuple(value)


def _is_pair(entry: Any) -> bool:
    return isinstance(entry, list | tuple) and len(entry) == 2
