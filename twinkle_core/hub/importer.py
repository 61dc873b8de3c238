"""Import a hub repo folder as a package under a unique module name.

The folder becomes package ``_twinkle_hub_<scheme>_<org>_<repo>_<revision>_<sha12>`` (registered in
``sys.modules`` with ``__path__ = [folder]``); its files are that package's submodules, so relative imports
between them work and two repos with the same file names never collide. ``sys.path`` is never touched.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from twinkle_core.errors import HubError


def package_name(scheme: str, org: str, repo: str, revision: str, sha256: str) -> str:
    """A valid, unique, stable module name for one repo snapshot."""
    raw = f'_twinkle_hub_{scheme}_{org}_{repo}_{revision}_{sha256[:12]}'
    return re.sub(r'\W', '_', raw)


def import_package(name: str, folder: Path) -> ModuleType:
    """Register `folder` as package `name` (running its ``__init__.py`` if it has one); idempotent."""
    if name in sys.modules:
        return sys.modules[name]
    init = folder / '__init__.py'
    if init.is_file():
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
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
        raise HubError(f'{where}: importing {module_name!r} failed: {exc}. Install what it needs '
                       f'(its twinkle.toml "requires").') from exc
    except Exception as exc:  # noqa: BLE001 - the component's own import-time error, with where it came from
        raise HubError(f'{where}: importing {module_name!r} from {folder} raised {type(exc).__name__}: {exc}') from exc
    for part in attr.split('.'):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise HubError(f'{where}: {module_name!r} has no attribute {attr!r} (entry {entry!r}).') from None
    return obj
