"""Import a hub repo folder as a package under a unique module name, from its verified sources only.

The folder becomes package ``_twinkle_hub_<scheme>_<org>_<repo>_<revision>_<sha12>`` (registered in
``sys.modules`` with ``__path__ = [folder]``); its files are that package's submodules, so relative imports
between them work and two repos with the same file names never collide. ``sys.path`` is never touched.

Every module of a hub package -- at load time or imported lazily later -- is found by `HubFinder` (first on
``sys.meta_path``) and compiled from its ``.py`` source by `SourceOnlyLoader`: bytecode is neither read
(a ``__pycache__/*.pyc`` or a sourceless ``*.pyc`` never runs in place of the verified source) nor written (the
verified tree stays exactly as hashed, so the next verification still matches). Extension modules
(``*.so``/``*.pyd``, covered by the sha256) load as usual; a module found nowhere raises `ModuleNotFoundError`
instead of falling through to the default path finder.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import threading
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any, Sequence

from twinkle_core.errors import HubError
from twinkle_core.hub.integrity import BYTECODE_DIR


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """`SourceFileLoader` that compiles the source on every import: it never reads nor writes bytecode."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


class HubFinder(importlib.abc.MetaPathFinder):
    """Finds the submodules of registered hub packages with `SourceOnlyLoader` (and extension modules)."""

    def __init__(self) -> None:
        self._roots: set[str] = set()
        self._lock = threading.Lock()

    def add(self, package: str) -> None:
        with self._lock:
            self._roots.add(package)
            if self not in sys.meta_path:
                sys.meta_path.insert(0, self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        top, dot, _ = fullname.partition('.')
        if not dot or top not in self._roots:
            return None
        if BYTECODE_DIR in fullname.split('.') or path is None:
            raise _not_found(fullname)
        portions = []
        for entry in path:
            finder = importlib.machinery.FileFinder(
                entry,
                (SourceOnlyLoader, importlib.machinery.SOURCE_SUFFIXES),
                (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
            )
            spec = finder.find_spec(fullname, target)
            if spec is None:
                continue
            if spec.loader is not None:
                return spec
            portions.extend(spec.submodule_search_locations or [])  # a folder without __init__.py
        if portions:
            spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
            spec.submodule_search_locations = portions
            return spec
        raise _not_found(fullname)  # never let the default finders look (they would run a sourceless *.pyc)


def _not_found(fullname: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(f'No module named {fullname!r}', name=fullname)


FINDER = HubFinder()


def package_name(scheme: str, org: str, repo: str, revision: str, sha256: str) -> str:
    """A valid, unique, stable module name for one repo snapshot."""
    raw = f'_twinkle_hub_{scheme}_{org}_{repo}_{revision}_{sha256[:12]}'
    return re.sub(r'\W', '_', raw)


def import_package(name: str, folder: Path) -> ModuleType:
    """Register `folder` as package `name` (running its ``__init__.py`` if it has one); idempotent."""
    if name in sys.modules:
        return sys.modules[name]
    FINDER.add(name)
    init = folder / '__init__.py'
    if init.is_file():
        spec = importlib.util.spec_from_file_location(
            name, init, loader=SourceOnlyLoader(name, str(init)), submodule_search_locations=[str(folder)]
        )
    else:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        if spec.loader is not None:
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def import_entry(package: str, folder: Path, entry: str, where: str) -> Any:
    """Import ``module:attr`` of `entry` from the hub package `package` rooted at `folder`."""
    module_name, _, attr = entry.partition(':')
    try:
        import_package(package, folder)
        obj: Any = importlib.import_module(f'{package}.{module_name}')
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith(package):
            raise HubError(f'{where}: entry module {module_name!r} not found in {folder}.') from exc
        raise HubError(
            f'{where}: importing {module_name!r} failed: {exc}. Install what it needs (its twinkle.toml "requires").'
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the component's own import-time error, with where it came from
        raise HubError(f'{where}: importing {module_name!r} from {folder} raised {type(exc).__name__}: {exc}') from exc
    for part in attr.split('.'):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise HubError(f'{where}: {module_name!r} has no attribute {attr!r} (entry {entry!r}).') from None
    return obj
