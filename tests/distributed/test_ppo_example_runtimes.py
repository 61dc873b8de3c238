"""examples/ppo.py (policy + critic + GAE + a KL penalty to the warm-started policy) runs unchanged under torchrun
(two DDP ranks, each rolling out its own prompts) and on Ray (policy, critic and KL reference each a Ray group, the
sampler a group of its own fed by weight syncs; one actor each here, two in the recorded run). The KL column
proves the wiring: at the first step the sampler samples the reference itself (KL 0 up to sampler-vs-model
numerics); after training steps it is not 0 -- on Ray only if the sampler received the trained policy's weights
(without the sync it would keep sampling the reference: KL 0 forever). Its learning over 60 steps in each runtime
is recorded in docs/benchmarks.md."""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spmd_runner import torchrun_command

EXAMPLE = Path(__file__).resolve().parents[2] / 'examples' / 'ppo.py'
STEPS = ('--steps', '3', '--warmup-steps', '3', '--kl-coef', '0.05')


def run_ppo(runtime: str, out: Path) -> dict[str, float]:
    """The example's printed summary (the first / last step's means: 3 steps make windows of one step)."""
    args = [str(EXAMPLE), '--runtime', runtime, '--output-dir', str(out), *STEPS]
    if runtime == 'torchrun':
        cmd = [*torchrun_command(2), *args]
    else:
        cmd = [sys.executable, *args, '--ranks', '1']  # data parallelism on Ray: docs/benchmarks.md's 60-step run
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'{runtime} run failed:\n{output[-5000:]}'
    summaries = [line for line in proc.stdout.splitlines() if line.startswith("{'reward_first'")]
    assert len(summaries) == 1, output[-3000:]  # printed once (rank 0), not once per rank
    return ast.literal_eval(summaries[0])


@pytest.mark.slow
@pytest.mark.parametrize('runtime', ['torchrun', 'ray'])
def test_ppo_example_runs_in_every_runtime(tmp_path, runtime) -> None:
    summary = run_ppo(runtime, tmp_path)
    assert summary['kl_first'] == pytest.approx(0.0, abs=1e-3)
    assert summary['kl_last'] > 1e-3, summary  # the sampler samples the trained policy, not the reference
    assert all(math.isfinite(v) for v in summary.values()), summary
    assert 0 <= summary['reward_first'] <= 1 and summary['value_loss_last'] > 0
