"""Run a worker script in one process or under torchrun (gloo on CPU) and read back its ``result.json``.

Workers: `distributed/train_worker.py` (the default: DDP / FSDP2 / TP of TransformersModel) and
`megatron/megatron_worker.py`. Every worker takes ``--model DIR --out DIR`` and writes ``OUT/result.json``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from twinkle_core.utils.net import free_port

TESTS = Path(__file__).parent
WORKER = TESTS / 'distributed' / 'train_worker.py'


def run_worker(model_dir: Path, out: Path, *, nproc: int = 1, extra: tuple[str, ...] = (),
               worker: Path = WORKER) -> dict:
    """Run `worker` in one process, or under torchrun with `nproc` ranks; return its result.json."""
    args = ['--model', str(model_dir), '--out', str(out), *extra]
    if nproc == 1:
        cmd = [sys.executable, str(worker), *args]
    else:
        cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', str(nproc),
               '--master_addr', '127.0.0.1', '--master_port', str(free_port()), str(worker), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert proc.returncode == 0, f'{" ".join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}'
    return json.loads((Path(out) / 'result.json').read_text())
