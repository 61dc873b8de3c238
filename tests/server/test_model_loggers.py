"""Metrics loggers chosen per model on the server (`models[].loggers`, `twinkle_server.service.model_loggers`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_config_file import GOOD, errors_of, write
from tracker_readers import offline_trackers_env, wandb_history

from twinkle_core import hooks
from twinkle_server.config import load_server_config
from twinkle_server.service.model_loggers import ModelLoggers


@pytest.fixture
def tiny_env(monkeypatch, tiny_model_dir):
    monkeypatch.setenv('TINY', str(tiny_model_dir))


def test_loggers_key_is_read_per_model(tmp_path: Path, tiny_env) -> None:
    text = GOOD + '    loggers: [wandb, {name: jsonl, path: /tmp/m.jsonl}]\n'
    config = load_server_config(write(tmp_path, text))
    assert config.model_specs['tiny'].loggers == ['wandb', {'name': 'jsonl', 'path': '/tmp/m.jsonl'}]
    (error,) = errors_of(write(tmp_path, GOOD + '    loggers: [{path: x}]\n', 'bad.yaml'))
    assert 'models[0].loggers' in error and 'not a list of logger names' in error


def test_model_loggers_feed_only_their_model(tmp_path: Path) -> None:
    loggers = ModelLoggers({'a': [{'name': 'jsonl', 'path': tmp_path / 'a.jsonl'}], 'b': []})
    loggers.record('a', 'run-1', 1, {'loss:sum': 2.0})
    loggers.record('b', 'run-2', 1, {'loss:sum': 3.0})  # no loggers: nothing
    (line,) = (tmp_path / 'a.jsonl').read_text().splitlines()
    record = json.loads(line)
    assert record['step'] == 1 and record['metrics'] == {'loss:sum': 2.0}
    assert record['context'] == {'adapter_name': 'run-1', 'model_id': 'a', 'is_training': True}
    with pytest.raises(ValueError, match='unknown metrics logger'):
        ModelLoggers({'a': ['nope']})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_server_model_logs_its_runs_to_jsonl_and_wandb(tmp_path: Path, tiny_model_dir, monkeypatch, sft_data):
    import tinker

    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.config import ModelSpec
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    offline_trackers_env(monkeypatch, tmp_path / 'home')
    jsonl = tmp_path / 'metrics.jsonl'
    loggers = [{'name': 'jsonl', 'path': str(jsonl)}, {'name': 'wandb', 'project': 'p', 'dir': str(tmp_path / 'wb')}]
    spec = ModelSpec('tiny', str(tiny_model_dir), loggers=loggers)
    config = ServerConfig(models={}, model_specs={'tiny': spec}, data_dir=str(tmp_path / 'data'), port=free_port())
    running = start_in_thread(config)
    try:
        client = tinker.ServiceClient(base_url=running.base_url, api_key=create_api_key(running.service.store, 'a'))
        trainer = client.create_lora_training_client(base_model='tiny', rank=4).result()
        for _ in range(2):
            trainer.forward_backward(sft_data, 'cross_entropy').result()
            trainer.optim_step(tinker.types.AdamParams(learning_rate=1e-3)).result()
    finally:
        running.stop()
        hooks.reset_plugin_manager()
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r['step'] for r in records] == [1, 1, 2, 2]
    assert {r['context']['adapter_name'] for r in records} == {trainer.model_id}
    assert 'loss:sum' in records[0]['metrics'] and 'learning_rate' in records[1]['metrics']
    (run,) = (tmp_path / 'wb' / 'wandb').glob('offline-run-*/run-*.wandb')  # one W&B run per training run
    logged = {r['step']: {} for r in records}
    for r in records:
        logged[r['step']].update(r['metrics'])
    assert wandb_history(run) == logged  # what W&B read back equals what the JSONL logger wrote
