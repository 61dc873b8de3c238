"""`scripts/gpu_bench.sh --dry-run`: the GPU benchmark run's CPU mode (tiny fixture, smallest settings) runs every
section -- MFU ladder, sampler, multi-tenant grid -- and merges one JSON, so the script that spends the lent GPU's
few minutes is known to work before it gets there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_bench_dry_run_writes_every_section(tmp_path):
    env = {**os.environ, 'OUT': str(tmp_path), 'PYTHON': sys.executable, 'GPU_BENCH_BUDGET_S': '400'}
    done = subprocess.run(
        ['bash', 'scripts/gpu_bench.sh', '--dry-run'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    merged = json.loads((tmp_path / 'gpu_bench.json').read_text())
    assert not any('missing' in section for section in merged.values()), merged
    rungs = {r['rung']: r for r in merged['ladder']['rungs']}
    assert len(rungs) == 4, sorted(rungs)  # the dry run's --only selection
    for name, rung in rungs.items():
        assert rung['tokens_per_s'] > 0 and len(rung['losses']) == 2, (name, rung)
    assert merged['ladder']['tokens_per_step'] == 256
    assert merged['multi_tenant']['throughput'][0]['tenants'] == 2
    assert merged['sampler']
