"""`bench/long_context.py --quick`: each probe runs in its own process (two torchrun ranks for sequence parallelism)
under a peak-RSS budget; activation checkpointing fits a longer sequence than the plain run in the same budget and
splitting the sequence over 2 ranks a longer one still, and the JSON has what docs/benchmarks.md records (longest
length, ratio to plain, tokens/s, step time at a common length)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_long_context_quick_checkpointing_fits_longer(tmp_path):
    out = tmp_path / 'long_context.json'
    done = subprocess.run(
        [sys.executable, 'bench/long_context.py', '--quick', '--json', str(out)],
        cwd=ROOT,
        env={**os.environ, 'OMP_NUM_THREADS': '1'},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report['budget_mib'] == 560 and report['baseline_peak_rss_mib'] < report['budget_mib']
    assert set(report['results']) == {'plain', 'checkpointing', '+ sequence parallel (2 ranks)'}
    plain, checkpointed = report['results']['plain'], report['results']['checkpointing']
    split = report['results']['+ sequence parallel (2 ranks)']
    for result in (plain, checkpointed, split):
        assert result['longest_tokens'] > 0 and result['peak_rss_mib_at_longest'] <= report['budget_mib']
        assert result['tokens_per_s_at_longest'] > 0 and result['step_s_at_common'] > 0
        assert any(not p['fits'] for p in result['probes'])  # the search found the limit, not the start
    assert checkpointed['longest_tokens'] > plain['longest_tokens']
    assert checkpointed['vs_plain'] == checkpointed['longest_tokens'] / plain['longest_tokens'] > 1
    assert split['longest_tokens'] > checkpointed['longest_tokens']
