"""Full-parameter training throughput and MFU at a realistic GPU shape: rows of `--seq-len` tokens (packed to the
full length, no padding), `--rows` of them per step, bf16, AdamW; both backends in one process, interleaved.

MFU = 6 x parameters x tokens/s / peak (H100/H200 SXM dense bf16: 989 TFLOP/s). The causal attention matmuls are
not in 6N; their share is printed separately (6 x layers x seq_len x heads x head_dim FLOPs per token, fwd+bwd).

    python bench/long_rows_gpu.py --model medium --seq-len 2048 --rows 16      # on one CUDA GPU
    python bench/long_rows_gpu.py --model tiny --seq-len 64 --rows 2 --steps 1 --rounds 1 --warmup 1   # CPU dry run
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

import torch
from megatron_backend import parameter_count, step_fn
from sft_throughput import report, time_interleaved

from twinkle_core.fixtures.tiny_model import SPECS, ensure_tiny_model


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='medium', help=f'fixture size ({", ".join(SPECS)}) or a model dir')
    parser.add_argument('--seq-len', type=int, default=2048)
    parser.add_argument('--rows', type=int, default=16)
    parser.add_argument('--steps', type=int, default=3)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--backends', default='TransformersModel,MegatronModel')
    parser.add_argument('--peak-tflops', type=float, default=989.0)
    return parser.parse_args()


def token_rows(vocab: int, seq_len: int, rows: int, seed: int) -> list[dict]:
    """`rows` rows of `seq_len` random token ids, every token trained."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        ids = [rng.randrange(3, vocab) for _ in range(seq_len)]
        out.append({'input_ids': ids, 'labels': list(ids)})
    return out


def main() -> None:
    args = parse_args()
    model_dir = str(ensure_tiny_model(args.model)) if args.model in SPECS else args.model
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    gpu = torch.cuda.is_available()
    dtype = 'bfloat16' if gpu else 'float32'
    batches = [
        token_rows(config.vocab_size, args.seq_len, args.rows, seed)
        for seed in range(args.warmup + args.steps * args.rounds)
    ]
    print(
        f'model {args.model}, {args.rows} rows x {args.seq_len} tokens per step, {dtype}, '
        f'{torch.cuda.get_device_name() if gpu else "CPU"}, torch {torch.__version__}'
    )
    variants = {}
    for backend in args.backends.split(','):
        try:
            variants[f'{backend} ({dtype})'] = step_fn(backend, model_dir, False, dtype)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot start is reported, the other still runs
            print(f'{backend}: not measured ({type(exc).__name__}: {exc})')
    rates = time_interleaved(variants, batches, args.warmup, args.steps, args.rounds)
    report(rates, next(iter(rates)))
    params = parameter_count(model_dir)
    heads_dim = config.num_attention_heads * getattr(
        config, 'head_dim', config.hidden_size // config.num_attention_heads
    )
    attention_per_token = 6 * config.num_hidden_layers * args.seq_len * heads_dim
    results = {}
    for name, values in rates.items():
        tokens_per_s = statistics.median(values)
        mfu = 6 * params * tokens_per_s / (args.peak_tflops * 1e12)
        attention = attention_per_token * tokens_per_s / (args.peak_tflops * 1e12)
        results[name] = {'tokens_per_s': tokens_per_s, 'mfu_6n': mfu, 'attention_share_of_peak': attention}
        print(f'{name:<36} MFU {mfu:6.1%} (6N, {params / 1e6:.0f}M params); causal attention adds {attention:5.1%}')
    if gpu:
        print(f'peak memory allocated: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB')
    print('RESULT ' + json.dumps({'seq_len': args.seq_len, 'rows': args.rows, 'results': results}))


if __name__ == '__main__':
    main()
