"""pluggy lifecycle hooks and the shipped metrics loggers (console, JSONL, TensorBoard)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from twinkle_core import hooks
from twinkle_core.hooks.loggers import ConsoleMetricsLogger, JsonlMetricsLogger, TensorBoardMetricsLogger, scalar


@pytest.fixture(autouse=True)
def fresh_manager(monkeypatch):
    for var in ('TWINKLE_METRICS_JSONL', 'TWINKLE_TENSORBOARD_DIR', 'TWINKLE_CONSOLE_METRICS'):
        monkeypatch.delenv(var, raising=False)
    hooks.reset_plugin_manager()
    yield
    hooks.reset_plugin_manager()
    logging.getLogger('twinkle.metrics').handlers.clear()
    logging.getLogger('twinkle.metrics').setLevel(logging.NOTSET)
    logging.getLogger('twinkle.metrics').propagate = True


def test_hook_specs_and_entry_point_discovery() -> None:
    pm = hooks.get_plugin_manager()
    for name in ('twinkle_metrics', 'twinkle_failure', 'twinkle_model_loaded', 'twinkle_cli'):
        assert hasattr(pm.hook, name)
    names = {name for name, _ in pm.list_name_plugin()}
    assert {'console_metrics', 'jsonl_metrics', 'tensorboard_metrics'} <= names
    assert not {'console_metrics', 'jsonl_metrics', 'tensorboard_metrics'} & set(hooks.failed_hook_plugins())


def test_jsonl_logger_from_env(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / 'm' / 'metrics.jsonl'
    monkeypatch.setenv('TWINKLE_METRICS_JSONL', str(path))
    hooks.emit_metrics(3, {'loss': 0.5, 'lr': 1e-4, 'note': 'x', 'bad': float('nan')}, {'adapter_name': 'a'})
    hooks.emit_metrics(4, {'loss': 0.25})
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x['step'] for x in lines] == [3, 4]
    assert lines[0]['metrics'] == {'loss': 0.5, 'lr': 1e-4, 'note': 'x', 'bad': 'nan'}
    assert lines[0]['context'] == {'adapter_name': 'a'} and lines[1]['context'] == {}


def test_jsonl_logger_constructor_arg_and_inert_default(tmp_path: Path) -> None:
    assert JsonlMetricsLogger().path is None
    logger = JsonlMetricsLogger(tmp_path / 'own.jsonl')
    hooks.register_hooks(logger, name='own')
    hooks.emit_metrics(1, {'acc': 1})
    assert json.loads((tmp_path / 'own.jsonl').read_text())['metrics'] == {'acc': 1.0}
    hooks.unregister_hooks(name='own')


def test_console_logger_is_quiet_by_default(capsys, monkeypatch) -> None:
    hooks.emit_metrics(1, {'loss': 1.0})
    captured = capsys.readouterr()
    assert captured.out == '' and captured.err == ''
    monkeypatch.setenv('TWINKLE_CONSOLE_METRICS', '1')
    hooks.reset_plugin_manager()
    hooks.emit_metrics(2, {'loss': 0.125}, {'adapter_name': 'tenant'})
    assert '[tenant/step 2] loss=0.125' in capsys.readouterr().err
    monkeypatch.setenv('TWINKLE_CONSOLE_METRICS', '0')
    assert ConsoleMetricsLogger().disabled


def test_tensorboard_logger(tmp_path: Path, monkeypatch) -> None:
    assert not TensorBoardMetricsLogger().active  # no TWINKLE_TENSORBOARD_DIR: inert, imports nothing
    pytest.importorskip('tensorboard')
    monkeypatch.setenv('TWINKLE_TENSORBOARD_DIR', str(tmp_path / 'tb'))
    hooks.reset_plugin_manager()
    hooks.emit_metrics(5, {'loss': 0.5, 'text': 'skipped'}, {'adapter_name': 'a'})
    events = list((tmp_path / 'tb').glob('events.out.tfevents.*'))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / 'tb'))
    acc.Reload()
    assert acc.Tags()['scalars'] == ['a/loss']
    assert acc.Scalars('a/loss')[0].step == 5


def test_failing_implementation_does_not_break_the_others(tmp_path: Path, caplog) -> None:
    class Broken:
        @hooks.hook
        def twinkle_metrics(self, step, metrics, context):
            raise RuntimeError('logger down')

        @hooks.hook
        def twinkle_failure(self, exc, context):
            raise RuntimeError('notifier down')

    seen = []

    class Notifier:
        @hooks.hook
        def twinkle_failure(self, exc, context):
            seen.append((type(exc).__name__, context))

        @hooks.hook
        def twinkle_model_loaded(self, model, model_id):
            seen.append(('loaded', model_id))

    hooks.register_hooks(Broken())
    hooks.register_hooks(JsonlMetricsLogger(tmp_path / 'ok.jsonl'))
    hooks.register_hooks(Notifier())
    with caplog.at_level(logging.WARNING):
        hooks.emit_metrics(1, {'loss': 1.0})
        hooks.emit_failure(ValueError('bad batch'), {'adapter_name': 'a'})
    assert (tmp_path / 'ok.jsonl').read_text().count('\n') == 1
    assert 'logger down' in caplog.text and 'notifier down' in caplog.text
    hooks.notify_model_loaded(object(), 'tiny')
    assert seen == [('ValueError', {'adapter_name': 'a'}), ('loaded', 'tiny')]


def test_scalar_conversion() -> None:
    assert scalar(1) == 1.0 and scalar(True) == 1.0 and scalar('x') is None and scalar([1]) is None
    np = pytest.importorskip('numpy')
    assert scalar(np.float32(0.5)) == 0.5 and scalar(np.array([1.0, 2.0])) is None
