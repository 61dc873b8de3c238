"""Helpers shared by the core tests (plain functions; fixtures live in conftest.py).

Imported as a top-level module (pytest puts this folder on sys.path in its default "prepend" import mode), so
tests run the same from any working directory.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TWINKLE = str(Path(sys.executable).with_name('twinkle'))


def run_twinkle(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the venv's `twinkle` console script."""
    return subprocess.run([TWINKLE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def write_repo(folder: Path, files: dict[str, str]) -> Path:
    """Write a component repo: {relative path: text}."""
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return folder


def populate_hf_cache(cache: Path, repo_id: str, revision: str, src: Path) -> Path:
    """Lay `src` out as huggingface_hub's cache does: models--org--repo/{refs/<rev>, snapshots/<commit>/<file>
    -> ../../blobs/<hash>}. Returns the snapshot folder."""
    repo_dir = cache / ('models--' + repo_id.replace('/', '--'))
    commit = hashlib.sha1(f'{repo_id}@{revision}:{sorted(p.name for p in src.rglob("*"))}'.encode()).hexdigest()
    snapshot = repo_dir / 'snapshots' / commit
    for path in sorted(p for p in src.rglob('*') if p.is_file()):
        data = path.read_bytes()
        blob = repo_dir / 'blobs' / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists() or link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / 'refs').mkdir(parents=True, exist_ok=True)
    (repo_dir / 'refs' / revision).write_text(commit)
    return snapshot


def populate_ms_cache(cache: Path, repo_id: str, revision: str, src: Path) -> Path:
    """Lay `src` out as modelscope's cache does: models/<org>--<repo>/snapshots/<revision>/<file>."""
    snapshot = cache / 'models' / repo_id.replace('/', '--') / 'snapshots' / revision
    if snapshot.exists():
        shutil.rmtree(snapshot)
    shutil.copytree(src, snapshot)
    return snapshot


# ---- hub component folders the hub tests publish ----------------------------------------------------------
PATCH_REPO = REPO_ROOT / 'hub' / 'qwen3-training-patches'
PATCH_MS = 'ms://twinkle-community/qwen3-training-patches'
PATCH_HF = 'hf://twinkle-community/qwen3-training-patches'

LOSS_REPO = {
    'twinkle.toml': '''
        name = "EchoLoss"
        kind = "loss"
        entry = "loss:EchoLoss"
        version = "0.1.0"
    ''',
    'loss.py': '''
        from twinkle_core.loss import Loss
        from .helpers import TAG

        class EchoLoss(Loss):
            tag = TAG
            def __call__(self, inputs, outputs, **kwargs):
                return {'loss': inputs}
    ''',
    'helpers.py': 'TAG = "{tag}"\n',
}


def loss_repo(folder: Path, tag: str) -> Path:
    files = dict(LOSS_REPO)
    files['helpers.py'] = files['helpers.py'].format(tag=tag)
    return write_repo(folder, files)
