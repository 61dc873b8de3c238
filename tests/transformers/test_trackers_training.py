"""Local training with trackers chosen by name: ``initialize(loggers=[...])``, then a LoRA run whose
`calculate_metric()` after each step reaches JSONL, W&B (offline) and SwanLab (offline); the trackers' own readers
load the runs back with the values the model returned, under the same names."""

from __future__ import annotations

import json

import pytest
from row_helpers import labelled_rows
from tracker_readers import offline_trackers_env, swanlab_scalars, wandb_history

import twinkle_core
from twinkle_core import hooks
from twinkle_transformers.model import TransformersModel

pytestmark = pytest.mark.usefixtures('one_thread')


def assert_same(got: dict[int, dict[str, float]], want: dict[int, dict[str, float]]) -> None:
    """The same steps, each with the same metric names and values."""
    assert list(got) == list(want)
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-6), step


@pytest.mark.timeout(300)
def test_a_lora_run_logs_its_metrics_to_every_chosen_tracker(tiny_model_dir, tmp_path, monkeypatch) -> None:
    offline_trackers_env(monkeypatch, tmp_path / 'home')
    hooks.reset_plugin_manager()
    twinkle_core.initialize(
        'local',
        loggers=[
            {'name': 'jsonl', 'path': tmp_path / 'metrics.jsonl'},
            {'name': 'wandb', 'project': 'sft', 'dir': tmp_path / 'wb'},
            {'name': 'swanlab', 'project': 'sft', 'log_dir': tmp_path / 'sw'},
        ],
    )
    try:
        model = TransformersModel(tiny_model_dir)
        model.add_adapter_to_model('default', {'r': 4})
        model.set_optimizer('AdamW', lr=1e-3)
        returned = {}
        for step in range(3):
            model.forward_backward(inputs=labelled_rows(step))
            model.clip_grad_and_step()
            metrics = model.calculate_metric()
            returned[step + 1] = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        pm = hooks.get_plugin_manager()
        for name in ('wandb_metrics', 'swanlab_metrics'):
            pm.get_plugin(name).close()
    finally:
        twinkle_core.shutdown()
        hooks.reset_plugin_manager()
    assert list(returned) == [1, 2, 3] and all('loss' in m for m in returned.values())
    jsonl = {r['step']: r['metrics'] for r in map(json.loads, (tmp_path / 'metrics.jsonl').read_text().splitlines())}
    assert_same(jsonl, returned)
    (wandb_run,) = (tmp_path / 'wb' / 'wandb').glob('offline-run-*/run-*.wandb')
    assert_same(wandb_history(wandb_run), returned)  # one run for the adapter, keys as in JSONL
    (swanlab_run,) = (tmp_path / 'sw').glob('run-*/run-*.swanlab')
    tagged = {step: {f'default/{k}': v for k, v in m.items()} for step, m in returned.items()}
    assert_same(swanlab_scalars(swanlab_run), tagged)  # tagged adapter/metric, as in TensorBoard
