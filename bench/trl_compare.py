"""What the benchmarks against Hugging Face TRL share (`sft_vs_trl.py`, `grpo_vs_trl.py`): their common flags, the
model directory they resolve, and running one implementation in a fresh child process (ours in this environment,
TRL in its own: ``--trl-python``), whose last stdout line is its JSON result.

TRL is not a dependency of this project: ``python -m venv trl-env && trl-env/bin/pip install torch==2.13.0
transformers==5.19.0 peft==0.21.2 accelerate datasets trl``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any


def add_common_flags(parser: argparse.ArgumentParser, *, steps: int, warmup: int, rounds: int) -> None:
    """--trl-python, --model, --steps, --warmup, --rounds, --gradient-checkpointing, --json and the hidden
    --child (which implementation a child process runs)."""
    parser.add_argument('--trl-python', required=True, help='the python of an environment with trl installed')
    parser.add_argument('--model', default=None, help='fixture size or a model dir (default: SmolLM2-135M-Instruct)')
    parser.add_argument('--steps', type=int, default=steps, help='timed steps')
    parser.add_argument('--warmup', type=int, default=warmup, help='untimed steps first')
    parser.add_argument('--rounds', type=int, default=rounds, help='fresh processes per run, order alternating')
    parser.add_argument('--gradient-checkpointing', action='store_true', help='recompute activations, in both')
    parser.add_argument('--json', help='write the results here')
    parser.add_argument('--child', choices=['ours', 'trl'], help=argparse.SUPPRESS)


def model_dir(model: str | None) -> str:
    """`model`: None (SmolLM2-135M-Instruct, `twinkle fixtures smollm2`), a fixture size, or a directory."""
    from twinkle_core.fixtures.tiny_model import SPECS, ensure_tiny_model

    if model is None:
        from twinkle_core.fixtures.real_models import ensure_real_model

        return str(ensure_real_model('smollm2'))
    return str(ensure_tiny_model(model)) if model in SPECS else model


def run_child(script: str, implementation: str, args: argparse.Namespace, extra: list[str]) -> dict:
    """Run `script` as a child (``--child implementation``) with the common flags and `extra`; its JSON result."""
    python = sys.executable if implementation == 'ours' else args.trl_python
    cmd = [python, script, '--child', implementation, '--model', args.model_dir, '--trl-python', args.trl_python]
    cmd += ['--steps', str(args.steps), '--warmup', str(args.warmup), *extra]
    cmd += ['--gradient-checkpointing'] if args.gradient_checkpointing else []
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, 'TOKENIZERS_PARALLELISM': 'false'})
    if done.returncode != 0:
        raise SystemExit(f'{implementation} failed:\n{done.stderr[-4000:]}')
    return json.loads(done.stdout.strip().splitlines()[-1])


def trl_run_settings(*, lr: float, steps: int, gradient_checkpointing: bool) -> dict[str, Any]:
    """The `TrainingArguments` both TRL children share: `steps` steps at a constant `lr`, AdamW without weight
    decay, clip 1.0, fp32 on the CPU, gradient checkpointing as asked, nothing saved, reported or shown."""
    return {
        'max_steps': steps,
        'learning_rate': lr,
        'lr_scheduler_type': 'constant',
        'warmup_steps': 0,
        'weight_decay': 0.0,
        'max_grad_norm': 1.0,
        'optim': 'adamw_torch',
        'gradient_checkpointing': gradient_checkpointing,
        'use_cpu': True,
        'bf16': False,
        'fp16': False,
        'save_strategy': 'no',
        'report_to': [],
        'dataloader_num_workers': 0,
        'disable_tqdm': True,
        'seed': 0,
    }


def peak_rss_mib() -> float:
    """This process's peak resident memory."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
