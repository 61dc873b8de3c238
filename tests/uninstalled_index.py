"""A component the curated index knows but whose distribution is never installed (resolution step 3), for the
tests of "indexed, not installed -> the pip install line". Made up, so those tests hold whichever first-party
plugins the venv has. Importable from every test folder (pytest puts tests/ on sys.path for its conftest)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

UNINSTALLED_NAME, UNINSTALLED_KIND, UNINSTALLED_DIST = 'DeepSpeedModel', 'model', 'twinkle-deepspeed'
UNINSTALLED_INDEX = f'''
[[component]]
name = "{UNINSTALLED_NAME}"
kind = "{UNINSTALLED_KIND}"
distribution = "{UNINSTALLED_DIST}"
description = "A made-up backend that no test environment installs."
'''


def installed(distribution: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(distribution)
        return True
    except PackageNotFoundError:
        return False


def index_with_uninstalled(folder: Path) -> Path:
    """A registry dir holding the repo's registry/*.toml plus the made-up `UNINSTALLED_INDEX` entry, for
    subprocesses (pass it as TWINKLE_REGISTRY_DIR) or in-process (set it and `registry_index.refresh()`)."""
    assert not installed(UNINSTALLED_DIST), f'{UNINSTALLED_DIST} is installed; pick another made-up name'
    folder.mkdir(parents=True, exist_ok=True)
    for toml in (REPO_ROOT / 'registry').glob('*.toml'):
        (folder / toml.name).write_text(toml.read_text())
    (folder / 'zz_uninstalled.toml').write_text(UNINSTALLED_INDEX)
    return folder
