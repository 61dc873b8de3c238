"""`twinkle console --logdir`: the real command serves the run and curve pages over JSONL metrics, checked in
headless Chromium (several runs overlaid, smoothing, log scale, XSS-safe run names, an evaluation's accuracy curve
with its interval)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

XSS = '<script>alert(1)</script>'


def _write_run(path: Path, steps: int, scale: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open('w', encoding='utf-8') as f:
        for step in range(1, steps + 1):
            record = {'step': step, 'time': time.time(), 'context': {}, 'metrics': {'loss': scale / step, 'lr': 1e-4}}
            f.write(json.dumps(record) + '\n')
        f.write('{"step": 99, "metr')  # a half-written last line is skipped


def _write_eval_run(path: Path, model_dir: str, steps: tuple[int, ...]) -> None:
    """A run's evaluation metrics as training writes them: `evaluate(step=...)` through the JSONL metrics logger."""
    from twinkle_core import hooks
    from twinkle_core.eval import evaluate
    from twinkle_core.eval.identity import SelfCognitionTask
    from twinkle_transformers.sampler import TorchSampler

    path.parent.mkdir(parents=True, exist_ok=True)
    before = os.environ.get('TWINKLE_METRICS_JSONL')
    os.environ['TWINKLE_METRICS_JSONL'] = str(path)
    hooks.reset_plugin_manager()
    try:
        sampler = TorchSampler(model_dir, device='cpu')
        for step in steps:
            evaluate(sampler, SelfCognitionTask(max_tokens=4), limit=3, step=step, progress=False)
    finally:
        hooks.reset_plugin_manager()
        if before is None:
            os.environ.pop('TWINKLE_METRICS_JSONL')
        else:
            os.environ['TWINKLE_METRICS_JSONL'] = before


@pytest.fixture(scope='module')
def local_console(tmp_path_factory, tiny_model_dir):
    logdir = tmp_path_factory.mktemp('logdir')
    _write_eval_run(logdir / 'sft_eval' / 'metrics.jsonl', str(tiny_model_dir), (0, 5, 10))
    _write_run(logdir / 'sft_a' / 'metrics.jsonl', 12, 4.0)
    _write_run(logdir / 'sft_b' / 'metrics.jsonl', 7, 2.0)
    _write_run(logdir / XSS / 'metrics.jsonl', 3, 1.0)
    (logdir / 'other.jsonl').write_text('{"not": "metrics"}\n')
    proc = subprocess.Popen(
        [sys.executable, '-m', 'twinkle_core.cli.main', 'console', '--logdir', str(logdir), '--port', '0'],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, 'PYTHONUNBUFFERED': '1'},
    )
    line = proc.stdout.readline()
    match = re.search(r'(http://\S+/console)', line)
    assert match, f'no URL in the first line: {line!r}'
    yield match.group(1)
    proc.terminate()
    proc.wait(timeout=10)


def test_local_api_and_headers(local_console):
    with urllib.request.urlopen(f'{local_console}/api/local/runs') as r:
        runs = {run['name']: run for run in json.load(r)['runs']}
        assert "script-src 'self'" in r.headers['Content-Security-Policy']
    assert set(runs) == {'sft_a', 'sft_b', 'sft_eval', XSS}
    assert runs['sft_a']['last_step'] == 12 and runs['sft_b']['points'] == 7
    request = urllib.request.Request(f'{local_console}/api/local/runs', method='POST', data=b'')
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request)
    assert err.value.code == 405


def test_local_console_in_browser(local_console, browser, artifacts_dir):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={'width': 1280, 'height': 900})
    errors: list[str] = []
    page.on('pageerror', lambda exc: errors.append(str(exc)))
    page.on('dialog', lambda d: errors.append(f'dialog: {d.message}'))  # an executed XSS would open one
    page.goto(local_console)
    page.wait_for_selector('.chart[data-metric="loss"] canvas')
    loss = page.locator('.chart[data-metric="loss"]')
    assert sorted(loss.get_attribute('data-points').split(',')) == ['12', '3', '7']  # three runs overlaid
    assert page.locator('#runs').get_by_text(XSS, exact=True).count() == 1  # rendered as text
    accuracy = page.locator('.chart[data-metric="eval/self_cognition/accuracy"]')
    assert accuracy.get_attribute('data-points') == '3'  # steps 0, 5, 10 of the evaluated run
    assert accuracy.get_attribute('data-interval') == 'true' and 'dashed: 95% interval' in accuracy.inner_text()
    assert page.locator('.chart[data-metric="eval/self_cognition/accuracy_low"]').count() == 0  # in its chart
    page.fill('#smoothing', '0.6')
    page.dispatch_event('#smoothing', 'input')
    assert page.text_content('#smoothing-value') == '0.6'
    page.check('#logscale')
    page.wait_for_selector('.chart[data-metric="loss"] canvas')
    page.uncheck(f'input.plot[value="{XSS}"]')
    expect(loss).to_have_attribute('data-points', re.compile(r'^\d+,\d+$'))  # CSP: no wait_for_function (eval)
    page.screenshot(path=str(artifacts_dir / 'local-runs.png'), full_page=True)
    assert errors == []
    page.close()
