"""MegatronModel vs TransformersModel throughput on the same SFT work, in one run: single process, and tp=2.

(Not `bench/megatron.py`: a script of that name would shadow the `megatron` package it benchmarks.)

The single-process variants run interleaved in this process (same batches, order rotated each round, median
over rounds). The tp=2 variant runs the same batches under torchrun (2 ranks, 1 thread each: the same 2 cores);
its rate is compared with this process's TransformersModel rate. Real (non-padding) tokens per second.

    python bench/megatron_backend.py                         # small fixture, full-parameter training, CPU
    python bench/megatron_backend.py --lora --rounds 5       # LoRA (r=16, all linear layers)
    python bench/megatron_backend.py --gpu --model medium --batch-size 32   # one CUDA GPU, bf16, with MFU

`--gpu` runs both backends on one GPU in bfloat16 (no tp run: one device) and adds MFU = 6 * parameters *
tokens/s / peak (`--peak-tflops`, default 989: H100/H200 SXM dense bf16); the `medium` fixture (~0.8B, random
weights) is large enough to keep the GPU busy, the small ones measure launch overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch
from sft_throughput import LORA, LR, build_batches, report, time_interleaved

from twinkle_core.fixtures.tiny_model import SPECS, ensure_tiny_model
from twinkle_core.utils.net import free_port


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default='small', help=f'fixture size ({", ".join(SPECS)}) or a model dir')
    parser.add_argument('--lora', action='store_true', help='train a LoRA adapter instead of all parameters')
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--max-turns', type=int, default=8)
    parser.add_argument('--steps', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--no-tp', action='store_true', help='skip the tp=2 run')
    parser.add_argument('--gpu', action='store_true', help='one CUDA GPU, bfloat16, tokens/s and MFU (no tp run)')
    parser.add_argument('--peak-tflops', type=float, default=989.0, help='--gpu: peak dense bf16 TFLOP/s')
    parser.add_argument('--tp-worker', default=None, help=argparse.SUPPRESS)  # internal: the torchrun side
    return parser.parse_args()


def step_fn(backend: str, model_dir: str, lora: bool, dtype: str = 'float32', **kwargs) -> Callable[[list[dict]], None]:
    from twinkle_core.registry import resolve

    model = resolve('model', backend, model_id=model_dir, dtype=dtype, **kwargs)
    if lora:
        model.add_adapter_to_model('default', LORA)
    model.set_optimizer('AdamW', lr=LR, weight_decay=0.0)

    def step(rows: list[dict]) -> None:
        model.forward_backward(inputs=rows)
        model.clip_grad_and_step(max_norm=1.0)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the timer measures finished work

    return step


def parameter_count(model_dir: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device('meta'):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def run_gpu(args: argparse.Namespace, model_dir: str, batches: list[list[dict]]) -> None:
    """Both backends on one CUDA GPU in bfloat16; tokens/s, ratio and MFU."""
    if not torch.cuda.is_available():
        raise SystemExit('--gpu needs a CUDA device.')
    print(f'GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}')
    variants = {
        'TransformersModel (1 GPU, bf16)': step_fn('TransformersModel', model_dir, args.lora, 'bfloat16'),
        'MegatronModel (1 GPU, bf16)': step_fn('MegatronModel', model_dir, args.lora, 'bfloat16'),
    }
    rates = time_interleaved(variants, batches, args.warmup, args.steps, args.rounds)
    report(rates, 'TransformersModel (1 GPU, bf16)')
    params = parameter_count(model_dir)
    for name, values in rates.items():
        mfu = 6 * params * statistics.median(values) / (args.peak_tflops * 1e12)
        print(f'{name:<36} MFU {mfu:6.1%}  (6 x {params / 1e6:.0f}M params x tokens/s / {args.peak_tflops:g} TFLOP/s)')
    if args.lora:
        print('LoRA computes no weight gradients of the base: 6 x params overstates its work (4 x is closer).')
    print(f'peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB (both models)')


def tp_worker(args: argparse.Namespace, model_dir: str, batches: list[list[dict]]) -> None:
    """Under torchrun: time MegatronModel over tp=2 on `batches`; rank 0 writes the rates to --tp-worker."""
    from twinkle_core.mesh import DeviceMesh

    mesh = DeviceMesh.from_sizes(tp_size=2, world_size=2, device_type='cpu')
    name = 'MegatronModel tp=2 (torchrun, 2x1 thread)'
    rates = time_interleaved(
        {name: step_fn('MegatronModel', model_dir, args.lora, device_mesh=mesh)},
        batches,
        args.warmup,
        args.steps,
        args.rounds,
    )
    if int(os.environ.get('RANK', 0)) == 0:
        Path(args.tp_worker).write_text(json.dumps(rates))


def run_tp(args: argparse.Namespace) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / 'rates.json'
        cmd = [
            sys.executable,
            '-m',
            'torch.distributed.run',
            '--nproc_per_node',
            '2',
            '--master_addr',
            '127.0.0.1',
            '--master_port',
            str(free_port()),
            __file__,
            *sys.argv[1:],
            '--tp-worker',
            str(out),
        ]
        subprocess.run(cmd, check=True, env={**os.environ, 'OMP_NUM_THREADS': '1'})
        return json.loads(out.read_text())


def main() -> None:
    args = parse_args()
    model_dir = str(ensure_tiny_model(args.model)) if args.model in SPECS else args.model
    torch.manual_seed(args.seed)
    batches = build_batches(
        model_dir, args.warmup + args.steps * args.rounds, args.batch_size, args.max_turns, args.seed
    )
    if args.tp_worker:
        return tp_worker(args, model_dir, batches)
    mode = 'LoRA' if args.lora else 'full-parameter'
    print(
        f'model {args.model}, {mode}, {len(batches)} batches of {args.batch_size} rows, '
        f'{statistics.mean(sum(len(r["input_ids"]) for r in b) for b in batches) / args.batch_size:.0f} '
        f'tokens/row, threads {torch.get_num_threads()}'
    )
    if args.gpu:
        return run_gpu(args, model_dir, batches)
    variants = {
        'TransformersModel (1 process)': step_fn('TransformersModel', model_dir, args.lora),
        'MegatronModel (1 process)': step_fn('MegatronModel', model_dir, args.lora),
    }
    rates = time_interleaved(variants, batches, args.warmup, args.steps, args.rounds)
    if not args.no_tp:
        rates.update(run_tp(args))
    report(rates, 'TransformersModel (1 process)')


if __name__ == '__main__':
    main()
