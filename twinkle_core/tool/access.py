"""What a tool declares it may reach beyond its sandbox, and the one check of that declaration.

A tool declares its needs as three attributes (`Tool.network`, `Tool.paths`, `Tool.env`; ``@tool(network=...,
paths=..., env=...)`` for a function tool). `check_access` checks and normalises such a declaration and
`declared_access` reads a tool's; `twinkle_agentic`'s sandbox grants exactly the resulting `Access` and nothing
more. Whether a declared path exists is a fact of the host that runs the calls, so the sandbox checks it when the
tool is added to a `ToolManager`, not here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from twinkle_core.errors import InvalidInputError

__all__ = ['PATH_MODES', 'Access', 'PathDeclaration', 'PathMode', 'check_access', 'declared_access']

PathMode = Literal['ro', 'rw']
PATH_MODES: tuple[PathMode, ...] = ('ro', 'rw')
# 'PATH' (read-only) or ('PATH', 'ro' | 'rw'); PATH absolute.
PathDeclaration = str | tuple[str, PathMode]


@dataclass(frozen=True)
class Access:
    """A checked declaration: `network`; `paths` as (absolute normalised path, mode) pairs, in declared order;
    `env`: the names of environment variables."""

    network: bool = False
    paths: tuple[tuple[str, PathMode], ...] = ()
    env: tuple[str, ...] = ()

    @property
    def read_only(self) -> tuple[str, ...]:
        """The paths declared read-only."""
        return tuple(path for path, mode in self.paths if mode == 'ro')

    @property
    def read_write(self) -> tuple[str, ...]:
        """The paths declared read-write."""
        return tuple(path for path, mode in self.paths if mode == 'rw')


def check_access(tool_name: str, network: Any = False, paths: Any = (), env: Any = ()) -> Access:
    """The `Access` of a declaration; `InvalidInputError` naming the tool and what is malformed: `network` not a
    bool, `paths` or `env` not a list (or tuple, set), a path entry neither 'PATH' nor ('PATH', 'ro' | 'rw'), a relative
    path, an `env` entry that is not a variable name."""
    if not isinstance(network, bool):
        raise InvalidInputError(f'tool {tool_name!r}: network must be True or False, got {network!r}')
    pairs: list[tuple[str, PathMode]] = []
    for entry in _sequence(tool_name, 'paths', paths):
        path, mode = (entry, 'ro') if isinstance(entry, str) else _pair(entry)
        if not isinstance(path, str) or mode not in PATH_MODES:
            raise InvalidInputError(
                f"tool {tool_name!r}: each of paths must be 'PATH' or ('PATH', 'ro' | 'rw'), got {entry!r}"
            )
        if not os.path.isabs(path):
            raise InvalidInputError(f'tool {tool_name!r}: path {path!r} must be absolute')
        pairs.append((os.path.normpath(path), mode))
    names = _sequence(tool_name, 'env', env)
    if not all(isinstance(n, str) and n and '=' not in n and '\0' not in n for n in names):
        raise InvalidInputError(f'tool {tool_name!r}: env must list variable names, got {env!r}')
    return Access(network, tuple(pairs), names)


def declared_access(tool: Any, tool_name: str | None = None) -> Access:
    """The checked declaration of `tool` (a `Tool`, its class, or any object with such attributes; a missing
    attribute declares nothing), named in errors as `tool_name` (default: the tool's ``name``)."""
    name = tool_name or getattr(tool, 'name', '') or repr(tool)
    return check_access(name, getattr(tool, 'network', False), getattr(tool, 'paths', ()), getattr(tool, 'env', ()))


def _sequence(tool_name: str, field: str, value: Any) -> tuple[Any, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise InvalidInputError(f'tool {tool_name!r}: {field} must be a list, got {value!r}')
    return tuple(value)


def _pair(entry: Any) -> tuple[Any, Any]:
    return (entry[0], entry[1]) if isinstance(entry, list | tuple) and len(entry) == 2 else (None, None)
