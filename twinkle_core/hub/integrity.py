"""The sha256 of a hub component folder: what registry/ pins and what is checked before hub code runs.

Definition (stable across machines and hub clients): walk the folder, skip every path with a component that
starts with "." (``.git``, ``.gitattributes``, hub client metadata such as ``.cache``/``.msc``) and every
``__pycache__`` / ``*.pyc``; for each remaining file in sorted order of its POSIX relative path feed
``<relative path> NUL <sha256 hex of the content> LF`` into one sha256. Symlinks (huggingface_hub's cache
links snapshot files to blobs) are followed, so a cached snapshot and the original folder hash the same.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from twinkle_core.errors import HubError


def hashed_files(folder: str | Path) -> list[str]:
    """The relative POSIX paths that `folder_sha256` covers, sorted."""
    root = Path(folder)
    if not root.is_dir():
        raise HubError(f'{folder} is not a directory.')
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = [d for d in dirnames if not _skipped(d)]
        for fn in filenames:
            if not _skipped(fn) and not fn.endswith(('.pyc', '.pyo')):
                out.append((Path(dirpath) / fn).relative_to(root).as_posix())
    return sorted(out)


def folder_sha256(folder: str | Path) -> str:
    """The pin of `folder` (64 hex digits), as defined in this module's docstring."""
    root = Path(folder)
    total = hashlib.sha256()
    for rel in hashed_files(root):
        digest = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        total.update(rel.encode('utf-8') + b'\0' + digest.encode('ascii') + b'\n')
    return total.hexdigest()


def _skipped(name: str) -> bool:
    return name.startswith('.') or name == '__pycache__'
