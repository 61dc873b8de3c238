"""W&B and SwanLab as metrics loggers: chosen by name, offline (no network, `tracker_readers.offline_trackers_env`),
and read back by the trackers' own readers with the same values as the JSONL logger's."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tracker_readers import offline_trackers_env, swanlab_scalars, wandb_history

from twinkle_core import hooks
from twinkle_core.hooks.select import build_logger, install_loggers, logger_names
from twinkle_core.hooks.trackers import SwanLabMetricsLogger, WandbMetricsLogger
from twinkle_core.hooks.wandb_log import wandb_log_complete

STEPS = [(1, {'loss': 2.5, 'lr': 1e-4, 'note': 'text'}), (2, {'loss': 1.25, 'lr': 2e-4}), (3, {'loss': 0.625})]


@pytest.fixture(autouse=True)
def offline_trackers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for var in ('TWINKLE_WANDB_PROJECT', 'TWINKLE_SWANLAB_PROJECT', 'TWINKLE_METRICS_JSONL'):
        monkeypatch.delenv(var, raising=False)
    offline_trackers_env(monkeypatch, tmp_path / 'home')
    hooks.reset_plugin_manager()
    yield
    hooks.reset_plugin_manager()


def expected(prefix: str = '') -> dict[int, dict[str, float]]:
    return {step: {prefix + k: v for k, v in m.items() if isinstance(v, float)} for step, m in STEPS}


def emit_steps(adapter: str) -> None:
    for step, metrics in STEPS:
        hooks.emit_metrics(step, metrics, {'adapter_name': adapter, 'is_training': True})


def test_trackers_are_listed_by_name_and_inert_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {'console', 'jsonl', 'tensorboard', 'wandb', 'swanlab'} <= set(logger_names())
    pm = hooks.get_plugin_manager()
    assert pm.get_plugin('wandb_metrics') is not None and pm.get_plugin('swanlab_metrics') is not None
    assert not WandbMetricsLogger().active and not SwanLabMetricsLogger().active
    emit_steps('a')  # nothing configured: neither library is imported
    code = 'import sys; from twinkle_core.hooks import emit_metrics; emit_metrics(1, {"loss": 1.0}); '
    code += 'print("wandb" in sys.modules, "swanlab" in sys.modules)'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ['False', 'False'], out.stderr
    monkeypatch.setenv('TWINKLE_WANDB_PROJECT', 'p')
    assert WandbMetricsLogger().active
    monkeypatch.setenv('RANK', '1')
    assert not WandbMetricsLogger().active  # only rank 0 logs
    with pytest.raises(ValueError, match='unknown metrics logger .nope.; installed: .*wandb'):
        build_logger('nope')


@pytest.mark.timeout(240)
def test_wandb_offline_run_reads_back_the_same_values(tmp_path: Path) -> None:
    jsonl = tmp_path / 'metrics.jsonl'
    loggers = install_loggers(
        [{'name': 'jsonl', 'path': jsonl}, {'name': 'wandb', 'project': 'twinkle-test', 'dir': tmp_path / 'wb'}]
    )
    emit_steps('tenant-a')
    emit_steps('tenant-b')  # a second adapter: its own run, its own steps
    loggers[1].close()
    runs = sorted((tmp_path / 'wb' / 'wandb').glob('offline-run-*/run-*.wandb'))
    assert len(runs) == 2
    read = [wandb_history(run) for run in runs]
    assert read[0] == read[1] == expected()
    from_jsonl = {}
    for line in jsonl.read_text().splitlines():
        record = json.loads(line)
        if record['context']['adapter_name'] == 'tenant-a':
            from_jsonl[record['step']] = {k: v for k, v in record['metrics'].items() if isinstance(v, float)}
    assert from_jsonl == read[0]  # the same names and values as the JSONL logger


@pytest.mark.timeout(240)
def test_wandb_close_returns_with_the_whole_log_on_disk(tmp_path: Path) -> None:
    """`run.finish()` returns before wandb-core writes out the log's last block (all of a small run), so `close`
    waits until the exit record is on disk (`wandb_log_complete`). Here a log of several 32 KiB blocks: every step
    reads back, records spanning blocks included, and a log cut short as before the stream closes is incomplete."""
    steps = {step: {'loss': 1.0 / step, 'lr': step * 1e-6, 'grad_norm': 0.5 + step} for step in range(1, 401)}
    logger = WandbMetricsLogger('twinkle-test', dir=tmp_path / 'wb')
    for step, metrics in steps.items():
        logger.twinkle_metrics(step=step, metrics=metrics, context={'adapter_name': 'tenant-a'})
    logger.close()
    (run,) = sorted((tmp_path / 'wb' / 'wandb').glob('offline-run-*/run-*.wandb'))
    data = run.read_bytes()
    assert len(data) > 2 * 32768 and wandb_log_complete(run)
    assert wandb_history(run) == steps
    partial = tmp_path / 'partial.wandb'
    for size in (7, (len(data) - 1) // 32768 * 32768, len(data) - 1):  # as on disk before the stream closes
        partial.write_bytes(data[:size])
        assert not wandb_log_complete(partial)


@pytest.mark.timeout(240)
def test_swanlab_offline_run_reads_back_the_same_values(tmp_path: Path) -> None:
    (logger,) = install_loggers([{'name': 'swanlab', 'project': 'twinkle-test', 'log_dir': tmp_path / 'sw'}])
    emit_steps('tenant-a')
    logger.close()
    (run,) = sorted((tmp_path / 'sw').glob('run-*/run-*.swanlab'))
    assert swanlab_scalars(run) == expected('tenant-a/')  # tagged adapter/metric, as in TensorBoard


@pytest.mark.timeout(240)
def test_initialize_chooses_loggers_by_name(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import twinkle_core
        from twinkle_core.hooks import emit_metrics, get_plugin_manager
        twinkle_core.initialize('local', loggers=[{{'name': 'swanlab', 'project': 'p', 'log_dir': {str(tmp_path)!r}}}])
        logger = get_plugin_manager().get_plugin('swanlab_metrics')
        emit_metrics(1, {{'loss': 0.5}}, {{}})
        logger.close()
        twinkle_core.shutdown()
    """)
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr
    (run,) = sorted(tmp_path.glob('run-*/run-*.swanlab'))
    assert swanlab_scalars(run) == {1: {'loss': 0.5}}
