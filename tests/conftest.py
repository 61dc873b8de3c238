"""Shared fixtures. The tiny model is built once per machine (cached, deterministic): docs/architecture.md §8."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: the suite's time budget: per-test durations recorded and checked (docs/contributing.md)
pytest_plugins = ('tests.time_budget', 'tests.file_order')

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')
# every Ray program a test starts gets an instance of its own, never a cluster that a test running beside it (another
# pytest-xdist worker) started on this machine; tests that join a cluster pass its address
os.environ.setdefault('RAY_ADDRESS', 'local')
# vLLM's CPU engines pin their OpenMP threads by default ('auto': on 2 cores every engine gets core 1, the other is
# kept for its scheduler), so the engines of tests running side by side all queue on one core while the other idles
# (measured: the dp-2 Ray GRPO test 67 s alone, 253-398 s beside other workers); unpinned, the OS spreads them
os.environ.setdefault('VLLM_CPU_OMP_THREADS_BIND', 'nobind')
# a vLLM engine that may (no process group in its process, no multiprocess=True) runs in the test's process: one
# process instead of three, ~16 s of CPU to start instead of ~35 s; the session's shared engine below and the restart
# test keep their own process, the default elsewhere
os.environ.setdefault('VLLM_ENABLE_V1_MULTIPROCESSING', '0')


@pytest.fixture(scope='session')
def tiny_model_dir() -> Path:
    """Directory of the deterministic tiny Qwen3 fixture (tokenizer + weights in HF format)."""
    from twinkle_core.fixtures.tiny_model import ensure_tiny_model

    return ensure_tiny_model('tiny')


@pytest.fixture(scope='session')
def tiny_moe_model_dir() -> Path:
    """The tiny Qwen3-MoE fixture (8 experts, top-2; same tokenizer): expert-parallelism tests."""
    from twinkle_core.fixtures.tiny_moe_model import ensure_tiny_moe_model

    return ensure_tiny_moe_model()


@pytest.fixture(scope='session')
def small_model_dir() -> Path:
    """A larger fixture model of the same architecture and tokenizer (e.g. a GKD teacher)."""
    from twinkle_core.fixtures.tiny_model import ensure_tiny_model

    return ensure_tiny_model('small')


@pytest.fixture(scope='session')
def self_cognition_path() -> Path:
    from twinkle_core.fixtures import data_path

    return data_path('self_cognition.jsonl')


@pytest.fixture(scope='session')
def vllm_sampler(tiny_model_dir):
    """ONE vLLM engine (its own engine-core process, as vLLM's default: ~25 s to start) on the tiny fixture for the
    whole session.
    Tests that change it (adapters, base weights) undo their changes. Skipped where vllm is not installed."""
    pytest.importorskip('vllm')
    from twinkle_core.registry import resolve

    sampler = resolve(
        'sampler',
        'vLLMSampler',
        model_id=str(tiny_model_dir),
        engine_args={'max_model_len': 256, 'max_lora_rank': 16},
        multiprocess=True,
    )
    yield sampler
    sampler.shutdown()


@pytest.fixture(scope='session')
def tiny_vl_model_dir() -> Path:
    """The tiny random-init Qwen3-VL fixture (tokenizer with vision tokens, image processor, weights)."""
    from twinkle_core.fixtures.tiny_vl_model import ensure_tiny_vl_model

    return ensure_tiny_vl_model('qwen3_vl')


@pytest.fixture(scope='session')
def tiny_qwen3_5_model_dir() -> Path:
    """The tiny random-init Qwen3.5 fixture (linear + full attention layers, vision tower)."""
    from twinkle_core.fixtures.tiny_vl_model import ensure_tiny_vl_model

    return ensure_tiny_vl_model('qwen3_5')


CHROMIUM = Path('/usr/bin/chromium')
#: where browser tests save their screenshots (kept after the run: CI artifacts; docs/console.md shows some)
ARTIFACTS = Path(__file__).resolve().parents[1] / 'test-artifacts'


@pytest.fixture(scope='module')
def browser():
    """A headless Chromium (Debian's, driven by Playwright) for one test module; skips without either. Not for the
    whole session: Playwright's sync API keeps an event loop running in the main thread while it is open, and
    later tests' `asyncio.run` would fail."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip('playwright is not installed (requirements/test.txt)')
    if not CHROMIUM.exists():
        pytest.skip(f'no {CHROMIUM}: apt-get install chromium chromium-driver (.ci/run does)')
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(CHROMIUM), args=['--no-sandbox', '--disable-gpu'])
        yield launched
        launched.close()


@pytest.fixture(scope='session')
def artifacts_dir() -> Path:
    """`test-artifacts/console`, created (screenshots of the browser tests)."""
    out = ARTIFACTS / 'console'
    out.mkdir(parents=True, exist_ok=True)
    return out
