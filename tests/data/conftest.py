"""Fixtures for the data pipeline tests: quiet `datasets`, the tiny fixture tokenizer and sample files."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope='session')
def _quiet_datasets() -> None:
    import datasets

    datasets.disable_progress_bars()


@pytest.fixture(scope='session')
def chat_template(tiny_model_dir: Path):
    from twinkle_core.template.chat_template import ChatTemplate

    return ChatTemplate(str(tiny_model_dir))


@pytest.fixture(scope='session')
def samples() -> dict[str, Path]:
    from twinkle_core.fixtures import data_path

    names = ('self_cognition', 'alpaca_sample', 'gsm8k_sample', 'sharegpt_sample')
    return {n.replace('_sample', ''): data_path(f'{n}.jsonl') for n in names}
