"""Which files a native request may make the server read (the one rule both native routes apply).

- A string names a local path when it has a path form (absolute, ``~``, ``.``-relative, a backslash, or a ``/``
  in anything but a bare ``org/name`` hub id) or exists relative to the server's working directory (so a bare
  ``secretdir`` is a path too). Such a path must resolve, symlinks followed, inside one of the allowed roots.
- A hub id (``org/name``) that does not exist locally is no path: it can only be fetched from the hub.
- A hub reference (``ms://``, ``hf://``) named by a client is refused where the server would load code from it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

from twinkle_core.hub.ref import is_repo_id
from twinkle_server.errors import ApiError


def roots_of(*roots: str | os.PathLike[str]) -> list[Path]:
    """`roots`, symlinks resolved (what `inside` compares against)."""
    return [Path(r).expanduser().resolve() for r in roots]


def inside(path: str | os.PathLike[str], roots: Iterable[Path]) -> bool:
    """`path` (``~`` expanded, symlinks resolved) is one of `roots` or lies below one; an unresolvable path
    (a NUL byte, a symlink loop) is not."""
    try:
        where = Path(path).expanduser().resolve()
    except (OSError, ValueError, RuntimeError):
        return False
    return any(where.is_relative_to(r) for r in roots)


def first_outside(path: str, roots: list[Path]) -> str | None:
    """The first file or directory reading `path` touches that is outside `roots`: `path` itself or, for a
    directory, anything below it (symlinked directories followed, each directory visited once); None when
    everything is inside."""
    if not inside(path, roots):
        return path
    pending, seen = [Path(path).expanduser().resolve()], set()
    while pending:
        directory = pending.pop()
        if directory in seen or not directory.is_dir():
            continue
        seen.add(directory)
        try:
            entries = list(directory.iterdir())
        except OSError:  # unreadable: the loader reports it
            continue
        for entry in entries:
            if not inside(entry, roots):
                return str(entry)
            pending.append(entry.resolve())
    return None


def names_local_path(text: str) -> bool:
    """Whether the server would read `text` from disk (see the module docstring)."""
    if text.startswith(('/', '~', '.')) or '\\' in text or ('/' in text and not is_repo_id(text)):
        return True
    return os.path.lexists(os.path.expanduser(text))


def refuse_foreign_paths(roots: list[Path], why: str, *values: Any) -> None:
    """403 for the first string in `values` (nested lists and dicts included) that names a local path outside
    `roots`; `why` says where files may come from."""
    for v in values:
        if isinstance(v, str) and names_local_path(v) and not inside(v, roots):
            raise ApiError(403, f'{v!r}: {why}')
        if isinstance(v, dict):
            refuse_foreign_paths(roots, why, *v.values())
        elif isinstance(v, (list, tuple)):
            refuse_foreign_paths(roots, why, *v)


def refuse_hub_refs(*values: Any) -> None:
    """403 for the first hub reference in `values` (nested lists and dicts included)."""
    for v in values:
        if isinstance(v, str) and '://' in v:
            raise ApiError(
                403,
                f'{v!r}: this server does not load components named by hub reference from a client '
                f'request; use a registered component name',
            )
        if isinstance(v, dict):
            refuse_hub_refs(*v.values())
        elif isinstance(v, (list, tuple)):
            refuse_hub_refs(*v)
