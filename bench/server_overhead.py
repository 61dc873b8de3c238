"""Overhead of the training service: the same LoRA SFT steps in-process vs through the tinker SDK + server.

    .venv/bin/python bench/server_overhead.py [--model tiny|small] [--steps 6] [--batch 8] [--seq-len 256]
                                              [--clients 8] [--requests 4]

1. In-process: `MultiLoraTransformersModel` + `CrossEntropyLoss(reduction='sum')`, forward_backward +
   clip_grad_and_step on `batch` x `seq_len` tokens.
2. Served: a `twinkle server start` subprocess on 127.0.0.1 (same engine), driven by the unmodified tinker SDK:
   forward_backward + optim_step on the same data.
Prints steps/s of both and their ratio (served / in-process; target >= 0.85), then p50/p99 latency of
forward_backward with `clients` concurrent SDK clients (each its own LoRA; they share the server's passes).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def make_rows(vocab: int, batch: int, seq_len: int, seed: int = 0) -> list[list[int]]:
    import random
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(seq_len)] for _ in range(batch)]


def in_process(model_dir: str, seqs: list[list[int]], steps: int) -> float:
    from twinkle_transformers.multi_lora.model import MultiLoraTransformersModel
    model = MultiLoraTransformersModel(model_id=model_dir, device='cpu')
    model.add_adapter_to_model('bench', {'r': 8, 'lora_alpha': 32, 'target_modules': 'all-linear'})
    model.set_optimizer('AdamW', lr=1e-4, adapter_name='bench')
    model.set_loss('CrossEntropyLoss', reduction='sum', adapter_name='bench')
    rows = [{'input_ids': s, 'labels': [-100] + s[1:]} for s in seqs]
    model.forward_backward(inputs=rows, adapter_name='bench')  # warm-up
    model.clip_grad_and_step(None, adapter_name='bench')
    t0 = time.perf_counter()
    for _ in range(steps):
        model.forward_backward(inputs=rows, adapter_name='bench')
        model.clip_grad_and_step(None, adapter_name='bench')
    return steps / (time.perf_counter() - t0)


def datums(seqs: list[list[int]]):
    from tinker import types
    return [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                        loss_fn_inputs={'target_tokens': s[1:], 'weights': [1.0] * (len(s) - 1)}) for s in seqs]


def served(url: str, key: str, seqs: list[list[int]], steps: int) -> float:
    import tinker
    from tinker import types
    tc = tinker.ServiceClient(base_url=url, api_key=key).create_lora_training_client(
        base_model='bench', rank=8, seed=0).result()
    data = datums(seqs)
    adam = types.AdamParams(learning_rate=1e-4)
    tc.forward_backward(data, 'cross_entropy').result()  # warm-up
    tc.optim_step(adam).result()
    t0 = time.perf_counter()
    for _ in range(steps):
        fwd, opt = tc.forward_backward(data, 'cross_entropy'), tc.optim_step(adam)
        fwd.result()
        opt.result()
    return steps / (time.perf_counter() - t0)


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


def start_server(model_dir: str, data_dir: str, port: int) -> subprocess.Popen:
    cmd = [sys.executable, '-m', 'twinkle_core.cli.main', 'server', 'start', '--model', f'bench={model_dir}',
           '--data-dir', data_dir, '--port', str(port), '--device', 'cpu']
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if httpx.get(f'http://127.0.0.1:{port}/api/v1/healthz', timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError('server did not start')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--model', choices=('tiny', 'small'), default='tiny')
    ap.add_argument('--steps', type=int, default=6)
    ap.add_argument('--batch', type=int, default=8)
    ap.add_argument('--seq-len', type=int, default=256)
    ap.add_argument('--clients', type=int, default=8)
    ap.add_argument('--requests', type=int, default=4)
    args = ap.parse_args()
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    import logging
    logging.getLogger('tinker').setLevel(logging.ERROR)
    from twinkle_core.fixtures.tiny_model import ensure_tiny_model
    from twinkle_server.auth import create_api_key
    from twinkle_server.launch import free_port
    from twinkle_server.store import Store

    model_dir = str(ensure_tiny_model(args.model))
    import json
    vocab = json.load(open(os.path.join(model_dir, 'config.json')))['vocab_size']
    seqs = make_rows(vocab, args.batch, args.seq_len)
    local = in_process(model_dir, seqs, args.steps)

    data_dir = tempfile.mkdtemp(prefix='twinkle-bench-')
    store = Store(data_dir)
    key = create_api_key(store, 'bench')
    store.close()
    port = free_port()
    proc = start_server(model_dir, data_dir, port)
    try:
        url = f'http://127.0.0.1:{port}'
        remote = served(url, key, seqs, args.steps)
        lat = sorted(concurrent_latency(url, key, seqs, args.clients, args.requests))
    finally:
        proc.kill()
        proc.wait()
    p50 = statistics.median(lat)
    p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
    print(f'model={args.model} batch={args.batch}x{args.seq_len} steps={args.steps}')
    print(f'in-process : {local:.3f} steps/s')
    print(f'served     : {remote:.3f} steps/s (tinker SDK -> 127.0.0.1)')
    print(f'ratio served/in-process = {remote / local:.3f} (target >= 0.85)')
    print(f'forward_backward latency, {args.clients} concurrent clients x {args.requests}: '
          f'p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms')


if __name__ == '__main__':
    main()
