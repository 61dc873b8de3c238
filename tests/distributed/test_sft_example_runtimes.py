"""The seeds' promise: examples/sft_lora.py runs unchanged in one process, under torchrun (DDP) and on Ray, and
every runtime logs the same training metrics (only the `initialize` call differs)."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / 'examples' / 'sft_lora.py'
METRICS = re.compile(r'step (\d+): loss ([\d.]+)\s+acc ([\d.]+)\s+grad_norm ([\d.]+)')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def run_example(runtime: str, out: Path) -> list[tuple[str, ...]]:
    args = [str(EXAMPLE), '--runtime', runtime, '--output-dir', str(out)]
    if runtime == 'torchrun':
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_addr',
               '127.0.0.1', '--master_port', str(_free_port()), *args]
    else:
        cmd = [sys.executable, *args, *(['--ranks', '2'] if runtime == 'ray' else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'{runtime} run failed:\n{output[-5000:]}'
    assert 'A: I am Twinkle' in output
    return METRICS.findall(output.replace('\r', '\n'))


@pytest.mark.slow
def test_sft_example_logs_identical_metrics_in_all_runtimes(tmp_path) -> None:
    local = run_example('local', tmp_path / 'local')
    assert [m[0] for m in local] == ['20', '40', '60', '80', '100']
    assert run_example('torchrun', tmp_path / 'torchrun') == local
    assert run_example('ray', tmp_path / 'ray') == local
