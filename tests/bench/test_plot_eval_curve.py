"""`bench/plot_eval_curve.py`: the eval curve of a run's metrics JSONL, by step, drawn as a PNG."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from PIL import Image

SCRIPT = Path(__file__).resolve().parents[2] / 'bench' / 'plot_eval_curve.py'


def load():
    spec = importlib.util.spec_from_file_location('plot_eval_curve', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_curve_is_read_by_step_and_drawn(tmp_path):
    plot = load()
    metrics = tmp_path / 'metrics.jsonl'
    rows = [
        {
            'step': 10,
            'metrics': {
                'eval/arithmetic/accuracy': 0.6,
                'eval/arithmetic/accuracy_low': 0.5,
                'eval/arithmetic/accuracy_high': 0.7,
            },
        },
        {'step': 3, 'metrics': {'loss': 1.0}},
        {
            'step': 0,
            'metrics': {
                'eval/arithmetic/accuracy': 0.1,
                'eval/arithmetic/accuracy_low': 0.05,
                'eval/arithmetic/accuracy_high': 0.15,
            },
        },
    ]
    metrics.write_text('\n'.join(json.dumps(r) for r in rows) + '\n')
    curve = plot.read_curve(metrics, 'arithmetic', 'accuracy')
    assert curve == [(0, 0.1, 0.05, 0.15), (10, 0.6, 0.5, 0.7)]
    out = tmp_path / 'curve.png'
    plot.plot([('arithmetic accuracy', curve), ('again', [(0, 0.9, 0.8, 1.0), (5, 0.2, 0.1, 0.3)])], 'title', out)
    image = Image.open(out).convert('RGB')
    assert image.size == (plot.WIDTH, plot.HEIGHT)
    colours = {colour for _, colour in image.getcolors(plot.WIDTH * plot.HEIGHT)}
    assert all(line in colours for line, _ in plot.COLOURS[:2])  # both curves drawn, each in its colour
    with pytest.raises(SystemExit, match='no eval/gsm8k/accuracy'):
        plot.read_curve(metrics, 'gsm8k', 'accuracy')
