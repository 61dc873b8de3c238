"""What the multi-tenant benches build and step: the tenants' rows, the multi-tenant engine with N adapters, the
N separate PEFT models baseline, one training step of each kind (mixed pass, tenants one after another, PEFT
models one after another); and, for the benches on several ranks, their common arguments and one torchrun launch of
a configuration (`rank_bench_arguments`, `run_ranks`)."""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

LR = 1e-4


def dtype_for(device: str):
    """bfloat16 on GPUs, float32 on CPU (bf16 matmuls are slow there) -- the engine's own default."""
    import torch

    return torch.float32 if device == 'cpu' else torch.bfloat16


def sync(device: str) -> None:
    """Wait for queued GPU work, so that a timer read next measures finished work."""
    if device.startswith('cuda'):
        import torch

        torch.cuda.synchronize()


def make_rows(n_rows: int, n_tokens: int, seed: int) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n_rows):
        ids = torch.randint(3, 1100, (n_tokens,), generator=g).tolist()
        rows.append({'input_ids': ids, 'labels': [-100] * 4 + ids[4:]})
    return rows


def rank_of(i: int, ranks: list[int]) -> int:
    """Tenant i's LoRA rank: the ranks are dealt round-robin (alpha = 2 x rank)."""
    return ranks[i % len(ranks)]


def build_engine(model_dir: str, n: int, ranks: list[int], device: str = 'cpu', **engine_kwargs):
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    engine = MultiLoraTransformersModel(model_dir, device=device, dtype=dtype_for(device), **engine_kwargs)
    for i in range(n):
        r = rank_of(i, ranks)
        engine.add_adapter_to_model(f't{i}', dict(r=r, lora_alpha=2 * r, target_modules='all-linear'))
        engine.set_optimizer('AdamW', lr=LR, adapter_name=f't{i}')
    return engine


def peft_models(model_dir: str, n: int, ranks: list[int], device: str = 'cpu', check_fit: bool = False):
    """N independent peft models (N - 1 deep copies of the base). With `check_fit` (CUDA), None instead where the
    copies would take more than 60% of the GPU memory still available (the rest is left for activations)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype_for(device))
    if device != 'cpu':
        base = base.to(device)
    if check_fit and device.startswith('cuda'):
        free, _ = torch.cuda.mem_get_info()
        available = free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        copy_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
        if (n - 1) * copy_bytes > 0.6 * available:
            return None
    models = []
    for i in range(n):
        m = get_peft_model(
            base if i == n - 1 else copy.deepcopy(base),
            LoraConfig(r=rank_of(i, ranks), lora_alpha=2 * rank_of(i, ranks), target_modules='all-linear'),
        )
        models.append((m, torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=LR)))
    return models


def padded(rows: list[dict], device: str = 'cpu'):
    import torch

    width = max(len(r['input_ids']) for r in rows)
    ids = torch.tensor([r['input_ids'] + [0] * (width - len(r['input_ids'])) for r in rows], device=device)
    labels = torch.tensor([r['labels'] + [-100] * (width - len(r['labels'])) for r in rows], device=device)
    mask = torch.tensor([[1] * len(r['input_ids']) + [0] * (width - len(r['input_ids'])) for r in rows], device=device)
    return ids, mask, labels


# ---- one training step of each kind ----------------------------------------------------------------------
def mixed_step(engine, data: dict[str, list[dict]]) -> None:
    engine.forward_backward(inputs=data)
    for name in data:
        engine.clip_grad_and_step(adapter_name=name)


def sequential_step(engine, data: dict[str, list[dict]]) -> None:
    for name, rows in data.items():
        engine.forward_backward(inputs=rows, adapter_name=name)
        engine.clip_grad_and_step(adapter_name=name)


def peft_step(models, batches) -> None:
    import torch

    for (model, optim), (ids, mask, labels) in zip(models, batches):
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)


def adapter_train_mb(model_dir: str, ranks: list[int], device: str = 'cpu') -> float:
    engine = build_engine(model_dir, 1, ranks, device)
    params = sum(p.numel() for p in engine.manager.parameters('t0'))
    return params * 4 * 4 / 2**20  # fp32 weight + grad + exp_avg + exp_avg_sq


def parse_rank_bench_arguments(parser: argparse.ArgumentParser, *, warmup: int) -> argparse.Namespace:
    """`parser`'s arguments plus those both rank benches take (the model, the tenants' work a step, the steps, the
    JSON output) and the hidden ones of a worker rank (``--worker``, ``--out``), parsed; outside a worker
    ``model_dir`` is resolved (the generated fixture of ``--model`` unless given)."""
    parser.add_argument('--model', default='tiny', choices=('tiny', 'small'))
    parser.add_argument('--model-dir', default=None)
    parser.add_argument('--tenants', type=int, default=16)
    parser.add_argument('--rows', type=int, default=4, help='global rows of each tenant a step')
    parser.add_argument('--tokens', type=int, default=64)
    parser.add_argument('--steps', type=int, default=4)
    parser.add_argument('--warmup', type=int, default=warmup, help='untimed steps first')
    parser.add_argument('--json', default=None)
    parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--out', default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.worker and args.model_dir is None:
        from twinkle_core.fixtures.tiny_model import ensure_tiny_model

        args.model_dir = str(ensure_tiny_model(args.model))
    return args


def run_ranks(script: str, world: int, args: argparse.Namespace, *extra: str) -> dict:
    """`script` as a worker on `world` torchrun ranks with `args`' common arguments and `extra`; rank 0's JSON."""
    out = Path(tempfile.mkdtemp(prefix='rank-bench-')) / 'result.json'
    cmd = [
        sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', str(world), script,
        '--worker', '--model-dir', args.model_dir, '--out', str(out), '--tenants', str(args.tenants),
        '--rows', str(args.rows), '--tokens', str(args.tokens), '--steps', str(args.steps),
        '--warmup', str(args.warmup), *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    if done.returncode != 0:
        raise SystemExit(f'{" ".join(cmd)} failed:\n{done.stderr[-4000:]}')
    return json.loads(out.read_text())
