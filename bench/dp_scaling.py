"""Data-parallel scaling: training tokens/s of TransformersModel on 1 process vs N processes (DDP), same global batch.

    python bench/dp_scaling.py                        # CPU, gloo: 1 vs 2 processes
    python bench/dp_scaling.py --nproc 2 --model small --steps 8 --batch-size 16
    python bench/dp_scaling.py --gpu                  # one GPU: plain vs FSDP2 (1-rank mesh), tokens/s and MFU

Both runs use the library's own path (``twinkle_core.initialize(mode='local', global_device_mesh=...)`` in every
process, `TransformersModel` with the mesh applied by `twinkle_transformers.parallel`) on the same data and
global batch; the N-process run is started from this script with torch.multiprocessing (the code path torchrun
uses). Each process is limited to one intra-op thread so that N processes use N cores, as a 1-core-per-rank
launch would. The first `--warmup` steps are not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def token_rows(num_rows: int, seq_len: int, vocab: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {'input_ids': (ids := [rng.randrange(3, vocab) for _ in range(seq_len)]), 'labels': list(ids)}
        for _ in range(num_rows)
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def train_and_time(rank: int, world: int, args: argparse.Namespace, port: int, out: str) -> None:
    """One rank: build the model on a dp=`world` mesh, train, write rank 0's timing to `out`."""
    import torch

    torch.set_num_threads(args.threads)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port)
    )
    import twinkle_core
    from twinkle_core.dataset import DataLoader
    from twinkle_core.fixtures.tiny_model import ensure_tiny_model
    from twinkle_core.mesh import DeviceMesh
    from twinkle_core.runtime import distributed
    from twinkle_transformers.model import TransformersModel

    mesh = DeviceMesh.from_sizes(dp_size=world) if world > 1 else None
    twinkle_core.initialize(mode='local', global_device_mesh=mesh)
    torch.manual_seed(0)
    model = TransformersModel(str(ensure_tiny_model(args.model)))
    if args.lora:
        model.add_adapter_to_model('default', {'r': 16, 'lora_alpha': 32, 'target_modules': 'all-linear'})
    model.set_optimizer('AdamW', lr=1e-4)
    vocab = model.model.config.vocab_size
    steps = args.warmup + args.steps
    loader = DataLoader(token_rows(args.batch_size * steps, args.seq_len, vocab), batch_size=args.batch_size)
    start, tokens = 0.0, 0
    for i, batch in enumerate(loader):
        if i == args.warmup:
            distributed.barrier()
            start = time.perf_counter()
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
        if i >= args.warmup:
            tokens += sum(len(r['input_ids']) for r in batch)
    distributed.barrier()
    elapsed = time.perf_counter() - start
    (total,) = distributed.all_reduce_sum([float(tokens)])
    if distributed.is_main_process():
        Path(out).write_text(json.dumps({'world': world, 'tokens': total, 'seconds': elapsed}))
    twinkle_core.shutdown()


def run(world: int, args: argparse.Namespace) -> dict[str, float]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / 'result.json')
        port = _free_port()
        if world == 1:
            ctx = mp.get_context('spawn')  # a fresh process too, so both runs pay the same start-up
            p = ctx.Process(target=train_and_time, args=(0, 1, args, port, out))
            p.start()
            p.join()
            if p.exitcode:
                raise SystemExit(f'the 1-process run failed (exit code {p.exitcode})')
        else:
            mp.spawn(train_and_time, args=(world, args, port, out), nprocs=world)
        result = json.loads(Path(out).read_text())
    result['tokens_per_second'] = result['tokens'] / result['seconds']
    return result


# ---- GPU: plain vs FSDP2 on one device (not measured in CPU-only sessions) -------------------------------------
def gpu_fsdp_vs_plain(args: argparse.Namespace) -> None:
    """tokens/s and MFU of one training step loop on one GPU: the plain module vs FSDP2 (1-rank mesh, bf16)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from twinkle_core.fixtures.tiny_model import ensure_tiny_model
    from twinkle_transformers.model import TransformersModel
    from twinkle_transformers.parallel import _apply_fsdp

    if not torch.cuda.is_available():
        raise SystemExit('--gpu needs a CUDA device.')
    os.environ.update(RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(_free_port()))
    dist.init_process_group('nccl', rank=0, world_size=1)
    peak = args.peak_tflops * 1e12
    results = {}
    for name in ('plain', 'fsdp2'):
        torch.manual_seed(0)
        model = TransformersModel(args.gpu_model or str(ensure_tiny_model(args.model)), dtype='bfloat16')
        if name == 'fsdp2':
            _apply_fsdp(model.model, init_device_mesh('cuda', (1,), mesh_dim_names=('fsdp',)))
        model.set_optimizer('AdamW', lr=1e-5)
        params = sum(p.numel() for p in model.model.parameters())
        vocab = model.model.config.vocab_size
        rows = token_rows(args.batch_size * (args.warmup + args.steps), args.seq_len, vocab)
        batches = [rows[i : i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
        for i, batch in enumerate(batches):
            if i == args.warmup:
                torch.cuda.synchronize()
                start = time.perf_counter()
            model.forward_backward(inputs=batch)
            model.clip_grad_and_step()
        torch.cuda.synchronize()
        tps = args.steps * args.batch_size * args.seq_len / (time.perf_counter() - start)
        results[name] = (tps, 6 * params * tps / peak)
        del model
        torch.cuda.empty_cache()
    dist.destroy_process_group()
    for name, (tps, mfu) in results.items():
        print(f'{name:6s}: {tps:10.0f} tokens/s  MFU {mfu:6.1%} (6 * params * tokens/s / {args.peak_tflops} TFLOP/s)')
    print(f'fsdp2 / plain tokens/s: {results["fsdp2"][0] / results["plain"][0]:.3f}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--nproc', type=int, default=2)
    parser.add_argument('--model', default='tiny', choices=['tiny', 'small'], help='fixture model')
    parser.add_argument('--lora', action='store_true', help='train a LoRA adapter instead of all parameters')
    parser.add_argument('--batch-size', type=int, default=16, help='global batch (rows)')
    parser.add_argument('--seq-len', type=int, default=128)
    parser.add_argument('--steps', type=int, default=6)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--threads', type=int, default=1, help='intra-op threads per process')
    parser.add_argument('--gpu', action='store_true', help='GPU: plain vs FSDP2 on one device, with MFU')
    parser.add_argument('--gpu-model', default=None, help='--gpu: model dir (default: the fixture)')
    parser.add_argument('--peak-tflops', type=float, default=989.0, help='--gpu: peak bf16 TFLOP/s (H100 SXM)')
    args = parser.parse_args()
    if args.gpu:
        gpu_fsdp_vs_plain(args)
        return
    print(f'python {" ".join(sys.argv)}  (cpu cores visible: {os.cpu_count()})')
    base = run(1, args)
    scaled = run(args.nproc, args)
    for r in (base, scaled):
        print(
            f'{r["world"]} process(es): {r["tokens_per_second"]:9.0f} tokens/s ({r["tokens"]:.0f} tokens in '
            f'{r["seconds"]:.2f} s)'
        )
    ratio = scaled['tokens_per_second'] / base['tokens_per_second']
    print(
        f'DDP scaling {args.nproc} vs 1 process: {ratio:.2f}x tokens/s (ideal {args.nproc:.0f}x; efficiency '
        f'{ratio / args.nproc:.0%})'
    )


if __name__ == '__main__':
    main()
