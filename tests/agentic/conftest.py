"""Fixtures shared by the agentic tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from twinkle_core import plugins


@pytest.fixture
def third_party_dist(tmp_path: Path) -> Iterator[Callable[[str, str, str], None]]:
    """`install(distribution, group, entry_point_line)`: a third-party distribution, metadata only (a .dist-info
    folder on sys.path), declaring one entry point; removed (and the plugin cache refreshed) after the test."""
    added: list[str] = []

    def install(distribution: str, group: str, line: str) -> None:
        root = tmp_path / distribution
        info = root / f'{distribution.replace("-", "_")}-0.0.1.dist-info'
        info.mkdir(parents=True)
        (info / 'METADATA').write_text(f'Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.0.1\n')
        (info / 'entry_points.txt').write_text(f'[{group}]\n{line}\n')
        sys.path.insert(0, str(root))
        added.append(str(root))
        plugins.refresh()

    yield install
    for path in added:
        sys.path.remove(path)
    plugins.refresh()


@pytest.fixture(scope='session')
def torch_sampler(tiny_model_dir: Path) -> Any:
    """One TorchSampler on the tiny fixture (random weights) for the agentic tests."""
    from twinkle_transformers.sampler.torch_sampler import TorchSampler

    return TorchSampler(str(tiny_model_dir), device='cpu')


@pytest.fixture(scope='session')
def template(tiny_model_dir: Path) -> Any:
    """The tiny fixture's chat template (renders tools, tool calls and tool turns)."""
    from twinkle_core.template.chat_template import ChatTemplate

    return ChatTemplate(str(tiny_model_dir))
