"""Run `train_worker.py` in one process or under torchrun (gloo on CPU) and read back its ``result.json``."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name('train_worker.py')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def run_worker(model_dir: Path, out: Path, *, nproc: int = 1, extra: tuple[str, ...] = ()) -> dict:
    """Run train_worker.py in one process, or under torchrun with `nproc` ranks; return its result.json."""
    args = ['--model', str(model_dir), '--out', str(out), *extra]
    if nproc == 1:
        cmd = [sys.executable, str(WORKER), *args]
    else:
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(nproc),
               '--master_addr', '127.0.0.1', '--master_port', str(_free_port()), str(WORKER), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert proc.returncode == 0, f'{" ".join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}'
    return json.loads((out / 'result.json').read_text())
