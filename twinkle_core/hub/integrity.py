"""The sha256 of a hub component folder: what registry/ pins and what is checked before hub code runs.

Definition (stable across machines and hub clients): walk the folder, skip every path with a component that
starts with "." (``.git``, ``.gitattributes``, hub client metadata such as ``.cache``/``.msc``; no module name
can start with ".", so nothing there is importable); for each remaining file *except Python bytecode* (anything
under a ``__pycache__`` folder, ``*.pyc``, ``*.pyo``) in sorted order of its POSIX relative path feed
``<relative path> NUL <sha256 hex of the content> LF`` into one sha256. Every other file is covered, whatever
its name: sources, extension modules (``*.so``/``*.pyd``), data. Symlinks (huggingface_hub's cache links
snapshot files to blobs) are followed, so a cached snapshot and the original folder hash the same.

Bytecode is not part of a component: `publish` never uploads it and the hash leaves it out, so a folder and its
published copy hash the same. But Python would run a ``__pycache__/*.pyc`` (or a sourceless ``*.pyc``) instead
of the verified source, so a folder that holds bytecode is refused before its code runs
(`check_no_bytecode` / `verified_sha256`), and hub code is always compiled from its source without writing
bytecode (`twinkle_core.hub.importer`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from twinkle_core.errors import HubError, IntegrityError

BYTECODE_DIR = '__pycache__'
BYTECODE_SUFFIXES = ('.pyc', '.pyo')


def _walk(folder: str | Path) -> tuple[list[str], list[str]]:
    """(hashed files, bytecode files) of `folder`, as sorted relative POSIX paths; dot-paths are in neither."""
    root = Path(folder)
    if not root.is_dir():
        raise HubError(f'{folder} is not a directory.')
    hashed: list[str] = []
    bytecode: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith('.')]
        rel_dir = Path(dirpath).relative_to(root)
        in_cache = BYTECODE_DIR in rel_dir.parts
        for fn in filenames:
            if fn.startswith('.'):
                continue
            rel = (rel_dir / fn).as_posix()
            (bytecode if in_cache or fn.endswith(BYTECODE_SUFFIXES) else hashed).append(rel)
    return sorted(hashed), sorted(bytecode)


def hashed_files(folder: str | Path) -> list[str]:
    """The relative POSIX paths that `folder_sha256` covers (and `publish` uploads), sorted."""
    return _walk(folder)[0]


def bytecode_files(folder: str | Path) -> list[str]:
    """Python bytecode in `folder` (files under ``__pycache__``, ``*.pyc``, ``*.pyo``; not under dot-paths),
    sorted: what `folder_sha256` leaves out and `check_no_bytecode` refuses."""
    return _walk(folder)[1]


def folder_sha256(folder: str | Path) -> str:
    """The pin of `folder` (64 hex digits), as defined in this module's docstring."""
    return _sha256_of(Path(folder), hashed_files(folder))


def check_no_bytecode(folder: str | Path, where: str | None = None) -> None:
    """Raise `IntegrityError` naming the first bytecode file in `folder`, if there is one. Python could run
    such a file instead of the (verified) source next to it, and it is not covered by the sha256."""
    found = bytecode_files(folder)
    if found:
        more = f' (and {len(found) - 1} more)' if len(found) > 1 else ''
        raise IntegrityError(
            f'{where + ": " if where else ""}{Path(folder) / found[0]}{more} is Python bytecode inside a hub '
            f'component folder. Bytecode is not covered by the sha256 pin and Python could run it instead of the '
            f'verified source, so the component is refused. Hub code never writes bytecode; delete that file '
            f'(or the whole folder {folder}, to download it again).'
        )


def file_hashes(folder: str | Path) -> dict[str, str]:
    """{relative POSIX path: sha256 hex} of every file `folder_sha256` covers: a pin's file-hash map."""
    root = Path(folder)
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in hashed_files(root)}


def check_file_hashes(folder: str | Path, pinned: dict[str, str], where: str) -> None:
    """Raise `IntegrityError` unless `folder` holds exactly the files of `pinned` with those sha256s, naming
    every changed, extra and missing file (bytecode is refused first, as by `verified_sha256`)."""
    check_no_bytecode(folder, where)
    found = file_hashes(folder)
    changed = sorted(rel for rel in found.keys() & pinned.keys() if found[rel] != pinned[rel])
    extra, missing = sorted(found.keys() - pinned.keys()), sorted(pinned.keys() - found.keys())
    problems = [
        f'{label}: {", ".join(names)}'
        for label, names in (('changed', changed), ('not in the pin (extra)', extra), ('missing', missing))
        if names
    ]
    if problems:
        raise IntegrityError(
            f'{where}: the files at {folder} do not match their pin ({"; ".join(problems)}). '
            f'Nothing was imported. Delete that folder to download it again, or review the '
            f'code and re-pin it (`twinkle hub hash <folder> --files`).'
        )


def verified_sha256(folder: str | Path, where: str | None = None) -> str:
    """`folder_sha256(folder)` after `check_no_bytecode`: what a folder must pass before its code is imported."""
    root = Path(folder)
    hashed, bytecode = _walk(root)
    if bytecode:
        check_no_bytecode(root, where)
    return _sha256_of(root, hashed)


def _sha256_of(root: Path, files: list[str]) -> str:
    total = hashlib.sha256()
    for rel in files:
        digest = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        total.update(rel.encode('utf-8') + b'\0' + digest.encode('ascii') + b'\n')
    return total.hexdigest()
