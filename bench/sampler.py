"""TorchSampler vs Hugging Face `generate`: generated tokens/s on the same model, prompts and sampling settings.

Both sides get the same left-padded batch of chat prompts (self-cognition queries through the fixture's chat
template), the same temperature/top-k/top-p, `max_new_tokens`, and stop at EOS. Throughput counts real generated
tokens (HF's padding after EOS is not counted). TorchSampler also returns per-token logprobs; the HF baseline is
run without scores (its cheapest configuration). Runs alternate (HF, sampler, HF, ...) so machine noise hits both;
the ratio of the medians is printed. A greedy pass first checks that both produce identical tokens.

vLLMSampler is compared with both in bench/sampler_vllm.py.

`--device` (default cuda when available, else cpu): on CUDA both sides run in bfloat16, timers synchronize the GPU
and `--threads` is ignored unless given. `--json PATH` also writes the results as one JSON object.

Run: .venv/bin/python bench/sampler.py [--model tiny|small|medium] [--batch 16] [--new-tokens 64] [--repeats 5]
                                      [--threads 1] [--shared] [--device cpu|cuda] [--json PATH]
     GPU: python bench/sampler.py --model medium --batch 32 --new-tokens 128 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    from twinkle_core.fixtures import data_path

    rows = [json.loads(line) for line in data_path('self_cognition.jsonl').read_text().splitlines() if line.strip()]
    prompts = []
    for row in rows[:count]:
        messages = [{'role': 'user', 'content': row['query']}]
        prompts.append(
            list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        )
    return prompts


def hf_generate(model, tokenizer, prompts: list[list[int]], new_tokens: int, sampling: dict) -> list[list[int]]:
    import torch

    length = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (length - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (length - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    kwargs = dict(do_sample=True, **sampling) if sampling['temperature'] > 0 else dict(do_sample=False)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, pad_token_id=pad, **kwargs)[
        :, length:
    ].tolist()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    return [_until_eos(row, eos) for row in out]


def _until_eos(row: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(row):
        if t in eos:
            return row[: i + 1]
    return row


def _sync(device: str) -> None:
    """Wait for queued GPU work, so that a timer read next measures finished work."""
    if device.startswith('cuda'):
        import torch

        torch.cuda.synchronize()


def main() -> None:
    from twinkle_core.fixtures.tiny_model import SPECS, ensure_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default='tiny', choices=list(SPECS), help='fixture size (medium: ~0.8B, GPUs)')
    parser.add_argument('--batch', type=int, default=16)
    parser.add_argument('--new-tokens', type=int, default=64)
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--temperature', type=float, default=0.8)
    parser.add_argument('--top-k', type=int, default=50)
    parser.add_argument('--top-p', type=float, default=0.95)
    parser.add_argument(
        '--threads',
        type=int,
        default=None,
        help='torch intra-op threads for both sides (default 1 on CPU = stable timings on a shared machine; on '
        'CUDA left as torch sets it)',
    )
    parser.add_argument('--device', default=None, help='cpu or cuda (default: cuda when available, else cpu)')
    parser.add_argument('--json', metavar='PATH', help='also write the results to PATH as one JSON object')
    parser.add_argument(
        '--shared',
        action='store_true',
        help='sampler shares the baseline model object (no in-place q/k/v fusion) instead of '
        'loading its own copy of the same weights',
    )
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from twinkle_core.types import SamplingParams
    from twinkle_transformers.sampler import TorchSampler

    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    cpu = device == 'cpu'
    if args.threads is None and cpu:
        args.threads = 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = torch.float32 if cpu else torch.bfloat16  # bf16 matmuls are slow on CPU
    model_dir = ensure_tiny_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = (model if cpu else model.to(device)).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sampler = (
        TorchSampler(model=model, tokenizer=tokenizer, max_batch_size=args.batch)
        if args.shared
        else TorchSampler(model_dir, device=device, dtype=dtype, max_batch_size=args.batch)
    )
    prompts = chat_prompts(tokenizer, args.batch)
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)

    greedy_hf = hf_generate(model, tokenizer, prompts, args.new_tokens, dict(sampling, temperature=0.0))
    greedy_ours = [r.sequences[0].tokens for r in sampler.sample(prompts, max_tokens=args.new_tokens, temperature=0.0)]
    same = sum(a == b for a, b in zip(greedy_hf, greedy_ours))
    print(f'greedy check: {same}/{len(prompts)} sequences identical to HF generate')

    params = SamplingParams(max_tokens=args.new_tokens, **sampling)
    hf_rates, our_rates = [], []
    for _ in range(args.repeats):
        _sync(device)
        start = time.perf_counter()
        out = hf_generate(model, tokenizer, prompts, args.new_tokens, sampling)
        _sync(device)
        hf_rates.append(sum(map(len, out)) / (time.perf_counter() - start))
        _sync(device)
        start = time.perf_counter()
        responses = sampler.sample(prompts, params)
        _sync(device)
        our_rates.append(sum(len(r.sequences[0].tokens) for r in responses) / (time.perf_counter() - start))
    hf, ours = statistics.median(hf_rates), statistics.median(our_rates)
    device_name = 'CPU' if cpu else torch.cuda.get_device_name(torch.device(device))
    print(
        f'model={args.model} batch={args.batch} new_tokens={args.new_tokens} {sampling} '
        f'threads={torch.get_num_threads()} repeats={args.repeats} shared={args.shared}'
        + ('' if cpu else f' device={device} ({device_name}) dtype=bfloat16')
    )
    print(f'HF generate:  {hf:8.0f} tokens/s (median; runs: {", ".join(f"{r:.0f}" for r in hf_rates)})')
    print(f'TorchSampler: {ours:8.0f} tokens/s (median; runs: {", ".join(f"{r:.0f}" for r in our_rates)})')
    print(f'ratio TorchSampler / HF generate = {ours / hf:.2f}x')
    if args.json:
        report = {
            'bench': 'sampler',
            'argv': sys.argv[1:],
            'model': args.model,
            'device': device,
            'device_name': device_name,
            'dtype': str(dtype).removeprefix('torch.'),
            'torch': torch.__version__,
            'threads': torch.get_num_threads(),
            'batch': args.batch,
            'new_tokens': args.new_tokens,
            'sampling': sampling,
            'repeats': args.repeats,
            'shared': args.shared,
            'greedy_identical': same,
            'greedy_total': len(prompts),
            'hf_generate': {'tokens_per_s': hf, 'runs_tokens_per_s': hf_rates},
            'torch_sampler': {'tokens_per_s': ours, 'runs_tokens_per_s': our_rates},
            'ratio_torch_sampler_over_hf': ours / hf,
        }
        with open(args.json, 'w') as f:
            json.dump(report, f, indent=2)
            f.write('\n')


if __name__ == '__main__':
    main()
