"""Fixtures shared by the Transformers backend tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture()
def one_thread():
    """The tiny model is fastest single-threaded (and the CI box is shared); restored afterwards.
    Use with ``pytestmark = pytest.mark.usefixtures('one_thread')``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope='session')
def tokenizer(tiny_model_dir):
    """The tiny fixture model's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
