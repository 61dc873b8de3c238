"""registry/ ships inside the wheel (twinkle_core/_registry/) and the index works from a non-editable install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from core_helpers import REPO_ROOT


def test_wheel_carries_registry_and_index_works_installed(tmp_path: Path) -> None:
    src = tmp_path / 'src'
    src.mkdir()
    for name in ('pyproject.toml', 'setup.py', 'MANIFEST.in', 'README.md'):
        if (REPO_ROOT / name).exists():
            shutil.copy2(REPO_ROOT / name, src / name)
    ignore = shutil.ignore_patterns('__pycache__', '*.pyc')
    shutil.copytree(REPO_ROOT / 'registry', src / 'registry', ignore=ignore)
    shutil.copytree(REPO_ROOT / 'twinkle_core', src / 'twinkle_core', ignore=ignore)
    done = subprocess.run(
        [
            sys.executable,
            '-m',
            'pip',
            '--disable-pip-version-check',
            'wheel',
            '-q',
            '--no-deps',
            '--no-build-isolation',
            '--no-index',
            str(src),
            '-w',
            str(tmp_path / 'dist'),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    wheel = next((tmp_path / 'dist').glob('twinkle_core-*.whl'))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n for n in names if n.startswith('twinkle_core/_registry/'))
    expected = sorted(f'twinkle_core/_registry/{p.name}' for p in (REPO_ROOT / 'registry').glob('*.toml'))
    assert shipped == expected
    site = tmp_path / 'site'
    zipfile.ZipFile(wheel).extractall(site)  # a plain (non-editable) install of the package files
    # Read the shipped index through registry_index directly: resolve() would answer from installed entry points
    # first (step 2), and every first-party distribution the index names may be installed in the test venv.
    code = (
        'import twinkle_core, twinkle_core.registry_index as ri\n'
        'print(twinkle_core.__file__); print(ri.index_dir())\n'
        'e = ri.lookup("model", "MegatronModel"); print(e.distribution, "|", e.target)\n'
        'print(sorted((x.kind, x.name) for x in ri.entries()))\n'
    )
    env = {k: v for k, v in os.environ.items() if k not in ('TWINKLE_REGISTRY_DIR', 'TWINKLE_LOCK_FILE')}
    out = subprocess.run(
        [sys.executable, '-c', code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, 'PYTHONPATH': str(site)},
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    module_file, index, megatron, listed = out.stdout.splitlines()[:4]
    assert module_file.startswith(str(site))
    assert index == str(site / 'twinkle_core' / '_registry')
    assert megatron == 'twinkle-megatron | pip install twinkle-megatron'
    in_repo = sorted(
        (item['kind'], item['name'])
        for path in (REPO_ROOT / 'registry').glob('*.toml')
        for item in tomllib.loads(path.read_text()).get('component', [])
    )
    assert listed == str(in_repo)  # the whole shipped index is read, the same entries as registry/
