"""vLLMSampler vs TorchSampler vs Hugging Face `generate`, and vLLM weight-sync time vs a memcpy, in one process.

Workloads (same prompts, same sampling settings for every engine; throughput counts real generated tokens):
  (a) `--batch` chat prompts x `--new-tokens` tokens (default 16 x 128), temperature 0.8, top-k 50, top-p 0.95;
  (b) `--mixed` prompts (default 256) of mixed lengths (8..192 tokens) whose completions end at mixed lengths:
      `--stop-tokens` frequent token ids stop a sequence (1..`--new-tokens` tokens, mean ~40 on the fixture),
      where continuous batching matters. HF generate runs (b) in batches of 64 (one batch OOMs nothing, but pads
      every row to the longest).
Runs alternate between engines so machine noise hits all of them; medians of `--repeats` runs are reported, and
ratios vLLM / TorchSampler and vLLM / HF. Weight sync: all base weights through `load_weights` (begin/end update)
and one LoRA adapter through `add_adapter`, against `torch.Tensor.copy_` of the same bytes.

Threads: torch runs with `--threads` intra-op threads here; vLLM's engine process is bound to as many CPUs
(VLLM_CPU_OMP_THREADS_BIND), so every engine gets the same compute.

Run: .venv/bin/python bench/sampler_vllm.py [--model tiny|small] [--batch 16] [--new-tokens 128] [--mixed 256]
                                          [--repeats 3] [--threads 1] [--in-process] [--no-lora]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def count_tokens(responses) -> int:
    return sum(len(s.tokens) for r in responses for s in r.sequences)


def hf_generate(model, prompts, params, pad_id: int, stop_ids: set[int], chunk: int) -> int:
    """Generated tokens (up to and including a stop token) of HF generate over `prompts` in chunks."""
    import torch

    total = 0
    for start in range(0, len(prompts), chunk):
        part = prompts[start : start + chunk]
        length = max(len(p) for p in part)
        ids = torch.tensor([[pad_id] * (length - len(p)) + p for p in part])
        mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in part])
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=params.max_tokens,
            do_sample=True,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            eos_token_id=sorted(stop_ids),
            pad_token_id=pad_id,
        )[:, length:].tolist()
        for row in out:
            cut = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
            total += cut
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default='tiny', choices=['tiny', 'small'])
    parser.add_argument('--batch', type=int, default=16)
    parser.add_argument('--new-tokens', type=int, default=128)
    parser.add_argument('--mixed', type=int, default=256)
    parser.add_argument('--stop-tokens', type=int, default=30)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--no-lora', action='store_true', help='build the vLLM engine with enable_lora=False')
    parser.add_argument(
        '--in-process', action='store_true', help="run vLLM's engine core in this process (no IPC) instead of its own"
    )
    args = parser.parse_args()
    os.environ.setdefault('VLLM_CPU_OMP_THREADS_BIND', '0' if args.threads == 1 else f'0-{args.threads - 1}')

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from twinkle_core.fixtures.tiny_model import ensure_tiny_model
    from twinkle_core.registry import resolve
    from twinkle_core.types import SamplingParams

    torch.set_num_threads(args.threads)
    model_dir = str(ensure_tiny_model(args.model))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch_sampler = resolve(
        'sampler', 'TorchSampler', model_id=model_dir, device='cpu', max_batch_size=max(args.batch, 64)
    )
    start = time.perf_counter()
    vllm_sampler = resolve(
        'sampler',
        'vLLMSampler',
        model_id=model_dir,
        engine_args={
            'max_model_len': 512,
            'max_num_seqs': 256,
            **({'enable_lora': False} if args.no_lora else {'max_lora_rank': 16}),
        },
        multiprocess=not args.in_process,
    )
    print(f'vLLM engine start: {time.perf_counter() - start:.1f} s')

    rng = random.Random(0)
    vocab = hf.config.vocab_size
    eos = hf.generation_config.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
    chat = [
        list(
            tokenizer.apply_chat_template(
                [{'role': 'user', 'content': f'Question {i}: who are you?'}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )
        for i in range(args.batch)
    ]
    mixed = [[rng.randrange(10, vocab) for _ in range(rng.randint(8, 192))] for _ in range(args.mixed)]
    stop_ids = sorted(rng.sample(range(10, vocab), args.stop_tokens))
    workloads = {
        f'(a) {args.batch} x {args.new_tokens}': (
            chat,
            SamplingParams(max_tokens=args.new_tokens, temperature=0.8, top_k=50, top_p=0.95),
            eos_ids,
        ),
        f'(b) {args.mixed} mixed': (
            mixed,
            SamplingParams(max_tokens=args.new_tokens, temperature=0.8, top_k=50, top_p=0.95, stop=stop_ids),
            eos_ids | set(stop_ids),
        ),
    }
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for label, (prompts, params, stops) in workloads.items():
        engines = {
            'vLLM': lambda prompts=prompts, params=params: count_tokens(vllm_sampler.sample(prompts, params)),
            'TorchSampler': lambda prompts=prompts, params=params: count_tokens(torch_sampler.sample(prompts, params)),
            'HF generate': lambda prompts=prompts, params=params, stops=stops: hf_generate(
                hf, prompts, params, pad, stops, chunk=64
            ),
        }
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for fn in engines.values():  # warm-up
            fn()
        for _ in range(args.repeats):
            for name, fn in engines.items():
                seconds, tokens = timed(fn)
                rates[name].append(tokens / seconds)
        med = {name: statistics.median(r) for name, r in rates.items()}
        print(
            f'{label}: '
            + ', '.join(f'{n} {v:,.0f} tok/s' for n, v in med.items())
            + f' | vLLM/TorchSampler {med["vLLM"] / med["TorchSampler"]:.2f}x, '
            f'vLLM/HF {med["vLLM"] / med["HF generate"]:.2f}x'
        )

    state = {k: v.clone() for k, v in hf.state_dict().items()}
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    targets = {k: torch.empty_like(v) for k, v in state.items()}

    def sync_base():
        vllm_sampler.begin_weight_update()
        vllm_sampler.load_weights(state)
        vllm_sampler.end_weight_update()

    def memcpy(src, dst):
        for k, v in src.items():
            dst[k].copy_(v)

    import peft

    lora = peft.get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        peft.LoraConfig(r=16, lora_alpha=32, target_modules='all-linear'),
    )
    adapter = {k: v.clone() for k, v in peft.get_peft_model_state_dict(lora).items()}
    adapter_config = lora.peft_config['default'].to_dict()
    adapter_bytes = sum(v.numel() * v.element_size() for v in adapter.values())
    adapter_targets = {k: torch.empty_like(v) for k, v in adapter.items()}
    times: dict[str, list[float]] = {'base': [], 'base memcpy': [], 'lora': [], 'lora memcpy': []}
    for _ in range(args.repeats + 1):
        times['base'].append(timed(sync_base)[0])
        times['base memcpy'].append(timed(lambda: memcpy(state, targets))[0])
        if not args.no_lora:
            times['lora'].append(timed(lambda: vllm_sampler.add_adapter('bench', adapter_config, adapter))[0])
            times['lora memcpy'].append(timed(lambda: memcpy(adapter, adapter_targets))[0])
    med = {k: statistics.median(v[1:]) for k, v in times.items() if v}
    print(
        f'weight sync, base {nbytes / 2**20:.1f} MiB: vLLM {med["base"] * 1e3:.1f} ms vs memcpy '
        f'{med["base memcpy"] * 1e3:.2f} ms ({med["base"] / med["base memcpy"]:.0f}x)'
    )
    if not args.no_lora:
        print(
            f'weight sync, LoRA r=16 all-linear {adapter_bytes / 2**20:.2f} MiB: vLLM {med["lora"] * 1e3:.1f} ms vs '
            f'memcpy {med["lora memcpy"] * 1e3:.3f} ms ({med["lora"] / med["lora memcpy"]:.0f}x)'
        )
    vllm_sampler.shutdown()


if __name__ == '__main__':
    main()
