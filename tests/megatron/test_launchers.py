"""MegatronModel starts its process groups under each way a one-rank run is launched: a plain process (every
in-process test) and ``torchrun --nproc_per_node 1``, whose rendezvous goes through torchrun's own store (a store
of its own on another port waited for that store forever: the run hung in ``init_process_group``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from spmd_runner import torchrun_command

WORKER = Path(__file__).with_name('megatron_worker.py')


@pytest.mark.slow
def test_one_rank_under_torchrun_trains(tiny_model_dir, tmp_path) -> None:
    cmd = [*torchrun_command(1), str(WORKER), '--model', str(tiny_model_dir), '--out', str(tmp_path), '--steps', '1']
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / 'result.json').read_text())
    assert result['world_size'] == 1 and len(result['losses']) == 1
