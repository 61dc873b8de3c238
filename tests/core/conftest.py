"""Fixtures for the core tests: offline hub caches laid out exactly as each hub client expects, component
repos written on the fly, and an isolated registry/ index."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Callable

import pytest

from twinkle_core.fixtures.hub_cache import populate_hf_cache, populate_ms_cache


@pytest.fixture
def offline_hubs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Both hub clients pointed at empty caches under tmp_path, offline, no local hub root, no blanket trust."""
    caches = {'hf': tmp_path / 'hf-cache', 'ms': tmp_path / 'ms-cache'}
    for c in caches.values():
        c.mkdir()
    monkeypatch.setenv('HF_HUB_CACHE', str(caches['hf']))
    monkeypatch.setenv('MODELSCOPE_CACHE', str(caches['ms']))
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('TWINKLE_HUB_OFFLINE', '1')
    monkeypatch.delenv('TWINKLE_HUB_ROOT', raising=False)
    monkeypatch.delenv('TWINKLE_TRUST_REMOTE_CODE', raising=False)
    return caches


@pytest.fixture
def publish_to_cache(offline_hubs: dict[str, Path]) -> Callable[[str, Path], Path]:
    """publish_to_cache('hf://org/repo@rev', folder) -> the cached snapshot folder."""

    def publish(ref: str, src: Path) -> Path:
        scheme, _, rest = ref.partition('://')
        repo_id, _, revision = rest.partition('@')
        if scheme == 'hf':
            return populate_hf_cache(offline_hubs['hf'], repo_id, revision or 'main', src)
        return populate_ms_cache(offline_hubs['ms'], repo_id, revision or 'master', src)

    return publish


@pytest.fixture
def registry_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """registry_dir(toml_text) -> an isolated index folder used instead of registry/."""
    from twinkle_core import registry_index

    def make(text: str) -> Path:
        folder = tmp_path / f'registry-{len(list(tmp_path.glob("registry-*")))}'
        folder.mkdir()
        (folder / 'index.toml').write_text(textwrap.dedent(text))
        monkeypatch.setenv('TWINKLE_REGISTRY_DIR', str(folder))
        registry_index.refresh()
        return folder

    yield make
    registry_index.refresh()
