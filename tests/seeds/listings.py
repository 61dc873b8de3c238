"""Running the ported Twinkle listings (examples/seeds/) as a user would, and what their SFT runs promise."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.spmd_runner import torchrun_command

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / 'examples' / 'seeds'


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, 'OMP_NUM_THREADS': '1', **(env or {})},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f'{cmd[-1]} failed:\n{output[-5000:]}'
    return output


def torchrun(script: str, cwd: Path, ranks: int = 2) -> str:
    """`script` of examples/seeds/ under torchrun on `ranks` CPU ranks; its output."""
    return run([*torchrun_command(ranks), str(SEEDS / script)], cwd)


def assert_sft_listing_learned(output: str, cwd: Path, tiny_model_dir: Path) -> None:
    """The SFT listing's log shows the loss falling and an evaluation below the first loss, and its best and last
    checkpoints are PEFT adapters that load on the Hugging Face model."""
    train = [float(m) for m in re.findall(r"Current is step \d+ of \d+, metric: \{'loss': ([0-9.]+)", output)]
    evals = [float(m) for m in re.findall(r"Eval metric: \{'loss': ([0-9.]+)", output)]
    assert len(train) >= 3 and evals, output[-3000:]
    assert train[-1] < train[0] and evals[0] < train[0]
    import peft
    from transformers import AutoModelForCausalLM

    for name in ('checkpoint-40', 'last-checkpoint'):
        peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cwd / 'output' / name)


def mean_row_loss(module, rows: list[dict]) -> float:
    import torch

    with torch.no_grad():
        return sum(
            float(module(input_ids=torch.tensor([r['input_ids']]), labels=torch.tensor([r['labels']])).loss)
            for r in rows
        ) / len(rows)
