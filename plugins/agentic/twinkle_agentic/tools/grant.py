"""What a sandboxed tool may reach beyond its sandbox: exactly what it declares in its ``network``, ``paths`` and
``env`` attributes (`twinkle_core.tool.base.Tool`, where they are typed and documented; ``@tool(network=...,
paths=..., env=...)``), checked once by `twinkle_core.tool.access.check_access`. A `Grant` is that checked
declaration; `grant_of` adds the one check that depends on this host: every declared path exists here.
"""

from __future__ import annotations

import os
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.tool.access import Access, declared_access

__all__ = ['Grant', 'grant_of']

Grant = Access  # the manager grants exactly what a tool declares


def grant_of(tool: Any) -> Grant:
    """The `Grant` declared by `tool` (`InvalidInputError` naming the tool for a malformed declaration or a
    declared path this host does not have)."""
    grant = declared_access(tool)
    for path, _ in grant.paths:
        if not os.path.exists(path):
            name = getattr(tool, 'name', '') or repr(tool)
            raise InvalidInputError(f'tool {name!r}: path {path!r} does not exist on this host')
    return grant
