"""Helpers shared by the core tests (plain functions; fixtures live in conftest.py).

Imported as a top-level module (pytest puts this folder on sys.path in its default "prepend" import mode), so
tests run the same from any working directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TWINKLE = str(Path(sys.executable).with_name('twinkle'))


def run_twinkle(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the venv's `twinkle` console script."""
    return subprocess.run(
        [TWINKLE, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, '-c', textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def write_repo(folder: Path, files: dict[str, str]) -> Path:
    """Write a component repo: {relative path: text}."""
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return folder


# ---- hub component folders the hub tests publish ----------------------------------------------------------
PATCH_REPO = REPO_ROOT / 'hub' / 'qwen3-training-patches'
PATCH_MS = 'ms://twinkle-community/qwen3-training-patches'
PATCH_HF = 'hf://twinkle-community/qwen3-training-patches'

LOSS_REPO = {
    'twinkle.toml': """
        name = "EchoLoss"
        kind = "loss"
        entry = "loss:EchoLoss"
        version = "0.1.0"
    """,
    'loss.py': """
        from twinkle_core.loss import Loss
        from .helpers import TAG

        class EchoLoss(Loss):
            tag = TAG
            def __call__(self, inputs, outputs, **kwargs):
                return {'loss': inputs}
    """,
    'helpers.py': 'TAG = "{tag}"\n',
}


def loss_repo(folder: Path, tag: str) -> Path:
    files = dict(LOSS_REPO)
    files['helpers.py'] = files['helpers.py'].format(tag=tag)
    return write_repo(folder, files)
