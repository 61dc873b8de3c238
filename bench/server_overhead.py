"""Overhead of the training service: the same LoRA SFT steps in-process vs through the tinker SDK + server.

    .venv/bin/python bench/server_overhead.py [--model tiny|small] [--steps 6] [--batch 8] [--seq-len 256]
                                              [--clients 8] [--requests 4]

1. In-process: `MultiLoraTransformersModel` + `CrossEntropyLoss(reduction='sum')`, forward_backward +
   clip_grad_and_step on `batch` x `seq_len` tokens.
2. Served: a `twinkle server start` subprocess on 127.0.0.1 (same engine), driven by the unmodified tinker SDK:
   forward_backward + optim_step on the same data.
The two are timed alternately step by step (so load from other processes hits both alike) with torch at
`--threads` threads in both processes; the ratio is median in-process step time / median served step time
(= served throughput relative to in-process; target >= 0.85). Then p50/p99 latency of forward_backward with
`clients` concurrent SDK clients (each its own LoRA; the server mixes them into shared passes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from tqdm import tqdm

from twinkle_server.launch import start_process


def make_rows(vocab: int, batch: int, seq_len: int, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(seq_len)] for _ in range(batch)]


def in_process_step(model_dir: str, seqs: list[list[int]]) -> Callable[[], None]:
    from twinkle_transformers.multi_lora.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel(model_id=model_dir, device='cpu')
    model.add_adapter_to_model('bench', {'r': 8, 'lora_alpha': 32, 'target_modules': 'all-linear'})
    model.set_optimizer('AdamW', lr=1e-4, adapter_name='bench')
    model.set_loss('CrossEntropyLoss', reduction='sum', adapter_name='bench')
    rows = [{'input_ids': s, 'labels': [-100] + s[1:]} for s in seqs]

    def step() -> None:
        model.forward_backward(inputs=rows, adapter_name='bench')
        model.clip_grad_and_step(None, adapter_name='bench')

    return step


def datums(seqs: list[list[int]]):
    from tinker import types

    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(s[:-1]),
            loss_fn_inputs={'target_tokens': s[1:], 'weights': [1.0] * (len(s) - 1)},
        )
        for s in seqs
    ]


def served_step(url: str, key: str, seqs: list[list[int]]) -> Callable[[], None]:
    import tinker
    from tinker import types

    tc = (
        tinker.ServiceClient(base_url=url, api_key=key)
        .create_lora_training_client(base_model='bench', rank=8, seed=0)
        .result()
    )
    data = datums(seqs)
    adam = types.AdamParams(learning_rate=1e-4)

    def step() -> None:
        fwd, opt = tc.forward_backward(data, 'cross_entropy'), tc.optim_step(adam)
        fwd.result()
        opt.result()

    return step


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def concurrent_latency(url: str, key: str, seqs: list[list[int]], clients: int, requests: int) -> list[float]:
    import tinker

    service = tinker.ServiceClient(base_url=url, api_key=key)
    tcs = [service.create_lora_training_client(base_model='bench', rank=8, seed=i).result() for i in range(clients)]
    data = datums(seqs)

    def loop(tc) -> list[float]:
        out = []
        for _ in range(requests):
            t0 = time.perf_counter()
            tc.forward_backward(data, 'cross_entropy').result()
            out.append(time.perf_counter() - t0)
        return out

    with ThreadPoolExecutor(clients) as pool:
        return [x for xs in pool.map(loop, tcs) for x in xs]


def start_server(model_dir: str, data_dir: str, port: int, threads: int) -> subprocess.Popen:
    return start_process(
        {'bench': model_dir},
        data_dir,
        port,
        extra_args=('--device', 'cpu'),
        env={'OMP_NUM_THREADS': str(threads), 'MKL_NUM_THREADS': str(threads)},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--model', choices=('tiny', 'small'), default='tiny')
    ap.add_argument('--steps', type=int, default=6)
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--seq-len', type=int, default=256)
    ap.add_argument('--clients', type=int, default=8)
    ap.add_argument('--requests', type=int, default=4)
    ap.add_argument('--threads', type=int, default=1, help='torch threads in the bench and the server process')
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    import logging

    logging.getLogger('tinker').setLevel(logging.ERROR)
    from twinkle_core.fixtures.tiny_model import ensure_tiny_model
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key
    from twinkle_server.store import Store

    model_dir = str(ensure_tiny_model(args.model))
    from transformers import AutoTokenizer

    seqs = make_rows(len(AutoTokenizer.from_pretrained(model_dir)), args.batch, args.seq_len)
    local_step = in_process_step(model_dir, seqs)

    data_dir = tempfile.mkdtemp(prefix='twinkle-bench-')
    store = Store(data_dir)
    key = create_api_key(store, 'bench')
    store.close()
    port = free_port()
    proc = start_server(model_dir, data_dir, port, args.threads)
    try:
        url = f'http://127.0.0.1:{port}'
        remote_step = served_step(url, key, seqs)
        local_step(), remote_step()  # warm-up
        local_t, remote_t = [], []
        for _ in tqdm(range(args.steps), desc='alternating steps'):
            local_t.append(timed(local_step))
            remote_t.append(timed(remote_step))
        lat = sorted(concurrent_latency(url, key, seqs, args.clients, args.requests))
    finally:
        proc.kill()
        proc.wait()
    p50 = statistics.median(lat)
    p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
    local, remote = statistics.median(local_t), statistics.median(remote_t)
    print(f'model={args.model} batch={args.batch}x{args.seq_len} steps={args.steps} threads={args.threads}')
    print(f'in-process : median {local * 1000:.0f} ms/step ({1 / local:.3f} steps/s)')
    print(f'served     : median {remote * 1000:.0f} ms/step ({1 / remote:.3f} steps/s, tinker SDK -> 127.0.0.1)')
    print(f'ratio served/in-process throughput = {local / remote:.3f} (target >= 0.85)')
    print(
        f'forward_backward latency, {args.clients} concurrent clients x {args.requests}: '
        f'p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms'
    )


if __name__ == '__main__':
    main()
