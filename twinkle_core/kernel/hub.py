"""Layer kernels from a hub repo in the Hugging Face ``kernels`` layout, imported by that library after the
repo's files were verified (`twinkle_core.hub.loader`: pinned in registry/ or a lock file, or trusted).

A kernel repo holds ``twinkle.toml`` (its kernel components: ``entry = "layers:<LayerClass>"``, ``replaces``,
``decorates``) and ``build/<variant>/<package>/{__init__,layers}.py`` + ``build/<variant>/metadata.json``; the
``kernels`` library picks the variant for this machine (``torch-universal`` runs everywhere) and imports it. It
neither hashes files nor refuses bytecode itself, so the import runs only after verification and with bytecode
writing off: the folder stays exactly as it was hashed.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator

from twinkle_core.errors import HubError
from twinkle_core.hub.manifest import check_requirements, read_manifest
from twinkle_core.hub.ref import HubRef
from twinkle_core.kernel.layer import LayerKernel, kernels_library

_loaded: dict[tuple[str, str], LayerKernel] = {}  # (folder sha256, component name) -> kernel


def load_layer_kernel(ref: HubRef, folder: Path, sha: str) -> LayerKernel:
    """The kernel component `ref` names in the verified repo `folder` (its files hash to `sha`)."""
    where = str(ref)
    spec = read_manifest(folder).select('kernel', ref.name, where)
    key = (sha, spec.name)
    if key not in _loaded:
        check_requirements(spec, where)
        kernels = kernels_library()
        with _no_bytecode_written():
            try:
                package = kernels.get_local_kernel(folder)
            except (FileNotFoundError, ValueError) as exc:
                raise HubError(f'{where}: the kernels library cannot load this repo: {exc}') from exc
        layer = getattr(getattr(package, 'layers', None), spec.attr, None)
        if layer is None:
            raise HubError(
                f'{where}: its kernel package has no layers.{spec.attr} (twinkle.toml entry {spec.entry!r}).'
            )
        _loaded[key] = LayerKernel(
            spec.name, layer, spec.layer_name, spec.decorates, source=f'{ref.repo_url}@{ref.effective_revision}'
        )
    return _loaded[key]


@contextlib.contextmanager
def _no_bytecode_written() -> Iterator[None]:
    previous, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        yield
    finally:
        sys.dont_write_bytecode = previous
