"""The MFU ladder: full-parameter training throughput of both backends at a GPU-sized shape, one change at a time.

Shape: `--rows` rows of `--seq-len` tokens per micro-batch (random token ids, every token trained, no padding),
`--accumulate` micro-batches per optimizer step (`forward_backward(micro_batch_size=rows)`): 8 x 2048 x 4 = 64k
tokens per step by default. Each rung builds a fresh model, runs `--warmup` untimed steps, then times `--steps`
steps (the GPU synchronised at both ends). Rungs are cumulative within a backend (see `RUNGS`); a rung that
needs what this machine lacks (Liger, CUDA) is reported as skipped, one that fails as failed, and the ladder goes
on. MFU = 6 x parameters x tokens/s / peak (H100/H200 SXM dense bf16: 989 TFLOP/s); the causal attention matmuls
are not in 6N and are printed separately. Results are written to `--json` after every rung.

    python bench/mfu_ladder.py --model medium --json /tmp/ladder.json            # one CUDA GPU (~4 min)
    python bench/mfu_ladder.py --model tiny --seq-len 64 --rows 2 --accumulate 2 --warmup 1 --steps 1 \\
        --compile-backend aot_eager --json /tmp/ladder.json                     # CPU dry run
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from long_rows_gpu import token_rows
from megatron_backend import parameter_count

from twinkle_core.fixtures.tiny_model import SPECS, ensure_tiny_model

LIGER_LOSS = 'LigerFusedLinearCrossEntropyLoss'
LIGER_LAYERS = ('LigerRMSNorm', 'LigerSwiGLUMLP')


@dataclass(frozen=True)
class Rung:
    """One measured configuration. `model`: constructor kwargs; `optimizer`: AdamW kwargs (``foreach=True`` is
    the unfused baseline); `unfuse`: switch a Megatron optimizer back to foreach; `needs`: 'liger' / 'cuda'."""

    name: str
    backend: str
    model: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    loss: str | None = None
    lora: bool = False
    unfuse: bool = False
    padding_free: bool = False
    sdpa: str | None = None
    needs: tuple[str, ...] = ()


HF, MG = 'TransformersModel', 'MegatronModel'
MIXED = {'mixed_precision': 'bf16'}
# In priority order (a run cut short keeps the first ones); docs/benchmarks.md groups them per backend.
COMPILED = {**MIXED, 'compile_layers': True}
CHUNKED = 'ChunkedCrossEntropyLoss'
LORA_BASE = {'dtype': 'bfloat16', 'compile_layers': True}
RUNGS: list[Rung] = [
    Rung('hf: bf16 params, foreach AdamW (old setup)', HF, {'dtype': 'bfloat16'}, {'foreach': True}),
    Rung('hf: fp32 master + bf16 autocast', HF, MIXED, {'foreach': True}),
    Rung('hf: + fused AdamW (default)', HF, MIXED),
    Rung('hf: + chunked linear CE', HF, MIXED, loss=CHUNKED),
    Rung('hf: + Liger fused linear CE', HF, MIXED, loss=LIGER_LOSS, needs=('liger',)),
    Rung('megatron: foreach AdamW', MG, unfuse=True),
    Rung('megatron: + fused AdamW (default)', MG),
    Rung('hf: chunked CE + compiled layers', HF, COMPILED, loss=CHUNKED),
    Rung('hf: Liger CE + compiled layers', HF, COMPILED, loss=LIGER_LOSS, needs=('liger',)),
    Rung('megatron: + compiled layers', MG, {'compile_layers': True}),
    # LoRA: the frozen base in bf16 (no master weights to keep), adapters in fp32
    Rung('hf: LoRA r=16 all-linear, compiled', HF, LORA_BASE, loss=CHUNKED, lora=True),
    Rung('megatron: LoRA r=16 all-linear, compiled', MG, {'compile_layers': True}, lora=True),
    Rung('hf: Liger CE + RMSNorm/SwiGLU', HF, {**MIXED, 'kernels': LIGER_LAYERS}, loss=LIGER_LOSS, needs=('liger',)),
    Rung('hf: Liger CE, SDPA cuDNN only', HF, MIXED, loss=LIGER_LOSS, sdpa='cudnn', needs=('liger',)),
    Rung('hf: chunked CE, padding-free rows', HF, MIXED, loss=CHUNKED, padding_free=True),
]
LORA = {'r': 16, 'lora_alpha': 32, 'target_modules': 'all-linear'}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='medium', help=f'fixture size ({", ".join(SPECS)}) or a model dir')
    parser.add_argument('--seq-len', type=int, default=2048)
    parser.add_argument('--rows', type=int, default=8, help='rows per micro-batch')
    parser.add_argument('--accumulate', type=int, default=4, help='micro-batches per optimizer step')
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--steps', type=int, default=2)
    parser.add_argument('--only', default='', help='comma-separated substrings: run the rungs whose name has one')
    parser.add_argument('--compile-backend', default='inductor', help="what compile_layers=True uses ('aot_eager')")
    parser.add_argument('--peak-tflops', type=float, default=989.0)
    parser.add_argument('--json', default=None, help='write the results here after every rung')
    return parser.parse_args()


def missing(rung: Rung) -> str | None:
    """Why `rung` cannot run here (None: it can)."""
    if ('cuda' in rung.needs or 'liger' in rung.needs) and not torch.cuda.is_available():
        return 'needs CUDA'
    if 'liger' in rung.needs and importlib.util.find_spec('liger_kernel') is None:
        return 'liger-kernel is not installed'
    return None


def build(rung: Rung, model_dir: str, compile_backend: str) -> Any:
    """The rung's model with its optimizer, loss and processor set."""
    from twinkle_core.registry import resolve

    kwargs = dict(rung.model)
    if kwargs.get('compile_layers') is True:
        kwargs['compile_layers'] = compile_backend
    if 'kernels' in kwargs:
        kwargs['kernels'] = list(kwargs['kernels'])
    if not torch.cuda.is_available():
        kwargs.pop('dtype', None)  # CPU dry run: float32
    model = resolve('model', rung.backend, model_id=model_dir, **kwargs)
    if rung.lora:
        model.add_adapter_to_model('default', LORA)
    model.set_optimizer('AdamW', lr=1e-5, weight_decay=0.0, **rung.optimizer)
    if rung.unfuse:  # the measured baseline: torch's foreach AdamW, as Megatron builds it without TE/Apex
        for group in model._state(None).optimizer.param_groups:
            group['fused'] = None
    if rung.loss:
        model.set_loss(rung.loss)
    if rung.padding_free:
        model.set_processor('CausalLMProcessor', padding_free=True)
    return model


def sdpa_context(backend: str | None) -> contextlib.AbstractContextManager[Any]:
    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([{'cudnn': SDPBackend.CUDNN_ATTENTION, 'flash': SDPBackend.FLASH_ATTENTION}[backend]])


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(rung: Rung, model_dir: str, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """tokens/s of `rung` over `args.steps` timed steps (after `args.warmup`), peak memory, compile/build time."""
    started = time.perf_counter()
    model = build(rung, model_dir, args.compile_backend)
    built = time.perf_counter() - started
    step_rows = args.rows * args.accumulate
    batches = [token_rows(vocab, args.seq_len, step_rows, seed) for seed in range(args.warmup + args.steps)]
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    losses = []
    with sdpa_context(rung.sdpa):
        first = time.perf_counter()
        for i, rows in enumerate(batches):
            if i == args.warmup:
                sync()
                warm = time.perf_counter() - first
                start = time.perf_counter()
            losses.append(model.forward_backward(inputs=rows, micro_batch_size=args.rows)['loss'])
            model.clip_grad_and_step(max_norm=1.0)
        sync()
    elapsed = time.perf_counter() - start
    tokens = args.steps * step_rows * args.seq_len
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    del model
    return {
        'tokens_per_s': tokens / elapsed,
        'step_s': elapsed / args.steps,
        'build_s': round(built, 1),
        'warmup_s': round(warm, 1),
        'peak_gib': peak,
        'losses': losses,
    }


def main() -> None:
    args = parse_args()
    model_dir = str(ensure_tiny_model(args.model)) if args.model in SPECS else args.model
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    params = parameter_count(model_dir)
    head_dim = getattr(config, 'head_dim', None) or config.hidden_size // config.num_attention_heads
    attention_flops_per_token = 6 * config.num_hidden_layers * args.seq_len * config.num_attention_heads * head_dim
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'
    header = {
        'device': device,
        'torch': torch.__version__,
        'model': args.model,
        'parameters': params,
        'seq_len': args.seq_len,
        'tokens_per_step': args.rows * args.accumulate * args.seq_len,
        'peak_tflops': args.peak_tflops,
        'date': time.strftime('%Y-%m-%d'),
    }
    print(json.dumps(header))
    results: list[dict[str, Any]] = []
    only = [s for s in args.only.split(',') if s]
    for rung in RUNGS:
        if only and not any(s in rung.name for s in only):
            continue
        entry: dict[str, Any] = {'rung': rung.name}
        reason = missing(rung)
        if reason:
            entry['skipped'] = reason
        else:
            try:
                entry.update(measure(rung, model_dir, args, config.vocab_size))
                entry['mfu_6n'] = 6 * params * entry['tokens_per_s'] / (args.peak_tflops * 1e12)
                entry['attention_share'] = attention_flops_per_token * entry['tokens_per_s'] / (args.peak_tflops * 1e12)
            except Exception as exc:  # noqa: BLE001 - a failing rung is reported; the ladder goes on
                entry['failed'] = f'{type(exc).__name__}: {exc}'[:500]
                traceback.print_exc()
        results.append(entry)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        torch._dynamo.reset()  # compiled graphs of this rung's model are not reused by the next
        print(format_entry(entry), flush=True)
        if args.json:
            with open(args.json, 'w') as f:
                json.dump({**header, 'rungs': results}, f, indent=1)


def format_entry(entry: dict[str, Any]) -> str:
    if 'tokens_per_s' not in entry:
        return f'{entry["rung"]:<44} {entry.get("skipped") or entry.get("failed")}'
    peak = f'{entry["peak_gib"]:.1f} GiB' if entry['peak_gib'] is not None else ''
    return (
        f'{entry["rung"]:<44} {entry["tokens_per_s"]:>10.0f} tokens/s  MFU {entry["mfu_6n"]:6.1%} '
        f'(+{entry["attention_share"]:.1%} attention)  step {entry["step_s"]:.2f} s  warm-up {entry["warmup_s"]} s '
        f'{peak}'
    )


if __name__ == '__main__':
    main()
