"""Build hook only (all metadata lives in pyproject.toml): ship the registry/ index inside the wheel.

registry/ at the repository root is the source of truth for the curated index. Wheels (and sdists built from
this tree) carry a copy as the data folder ``twinkle_core/_registry/``, which `twinkle_core.registry_index`
reads when the repo-root folder is not there (i.e. in a non-editable install). Editable installs read
registry/ directly, so edits show up without a rebuild.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

REGISTRY = Path(__file__).resolve().parent / 'registry'


class BuildPyWithRegistry(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode or not REGISTRY.is_dir():
            return
        target = Path(self.build_lib) / 'twinkle_core' / '_registry'
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(REGISTRY.glob('*.toml')):
            shutil.copyfile(path, target / path.name)


setup(cmdclass={'build_py': BuildPyWithRegistry})
