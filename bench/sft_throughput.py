"""LoRA SFT throughput, three ways in one process: a raw transformers+peft loop (padded), TransformersModel
padded, TransformersModel padding-free. Prints real (non-padding) tokens per second and the ratios to the raw loop.

Rows are self-cognition conversations of 1..`--max-turns` question/answer turns (variable lengths, as in real SFT
data), encoded with the chat template. All variants train the same LoRA on the same batches; they run
interleaved (order rotated each round) after a warmup, and the median over rounds is reported.

    python bench/sft_throughput.py                       # small fixture model, CPU
    OMP_NUM_THREADS=1 python bench/sft_throughput.py --model tiny --rounds 5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Callable

import torch
from tqdm import tqdm

from twinkle_core.fixtures import data_path
from twinkle_core.fixtures.tiny_model import SPECS, ensure_tiny_model

LORA = {'r': 16, 'lora_alpha': 32, 'target_modules': 'all-linear'}
LR = 1e-4


def parse_args(description: str | None = None) -> argparse.Namespace:
    """The options shared by the SFT benchmarks (`description`: the calling script's)."""
    parser = argparse.ArgumentParser(description=description or __doc__.split('\n')[0])
    parser.add_argument('--model', default='small', help=f'fixture size ({", ".join(SPECS)}) or a model dir')
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--max-turns', type=int, default=8, help='rows have 1..max-turns QA turns')
    parser.add_argument('--steps', type=int, default=5, help='timed steps per variant per round')
    parser.add_argument('--warmup', type=int, default=2, help='untimed steps per variant before the first round')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args()


def build_batches(model_dir: str, n_batches: int, batch_size: int, max_turns: int, seed: int) -> list[list[dict]]:
    """Encoded multi-turn self-cognition rows (lengths vary ~max_turns-fold), grouped into batches."""
    from twinkle_core.registry import resolve

    template = resolve('template', 'Template', model_id_or_tokenizer=model_dir)
    pairs = [json.loads(line) for line in data_path('self_cognition.jsonl').read_text().splitlines() if line]
    rng = random.Random(seed)

    def fill(text: str) -> str:
        return text.replace('{{NAME}}', 'Twinkle').replace('{{AUTHOR}}', 'ModelScope')

    batches = []
    for _ in range(n_batches):
        rows = []
        for _ in range(batch_size):
            messages = []
            for pair in rng.sample(pairs, rng.randint(1, max_turns)):
                messages += [
                    {'role': 'user', 'content': fill(pair['query'])},
                    {'role': 'assistant', 'content': fill(pair['response'])},
                ]
            rows.append(template.encode({'messages': messages}))
        batches.append(rows)
    return batches


def raw_step_fn(model_dir: str) -> Callable[[list[dict]], None]:
    """The baseline: transformers + peft, right-padded batches, the model's own loss, AdamW."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(task_type='CAUSAL_LM', **LORA))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR)

    def step(rows: list[dict]) -> None:
        width = max(len(r['input_ids']) for r in rows)
        ids = torch.tensor([r['input_ids'] + [0] * (width - len(r['input_ids'])) for r in rows])
        labels = torch.tensor([r['labels'] + [-100] * (width - len(r['labels'])) for r in rows])
        mask = torch.tensor([[1] * len(r['input_ids']) + [0] * (width - len(r['input_ids'])) for r in rows])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def twinkle_step_fn(model_dir: str, padding_free: bool, kernels: tuple[str, ...] = ()) -> Callable[[list[dict]], None]:
    from twinkle_transformers.model import TransformersModel

    model = TransformersModel(model_dir, dtype='float32', kernels=kernels)
    if kernels:
        print(f'  kernels {" + ".join(kernels)}: replaced {model.kernels}')
    model.add_adapter_to_model('default', LORA)
    model.set_processor('CausalLMProcessor', padding_free=padding_free)
    model.set_optimizer('AdamW', lr=LR)

    def step(rows: list[dict]) -> None:
        model.forward_backward(inputs=rows)
        model.clip_grad_and_step(max_norm=1.0)

    return step


def main() -> None:
    args = parse_args()
    model_dir = str(ensure_tiny_model(args.model)) if args.model in SPECS else args.model
    torch.manual_seed(args.seed)
    n_batches = args.warmup + args.steps * args.rounds
    batches = build_batches(model_dir, n_batches, args.batch_size, args.max_turns, args.seed)
    real = [sum(len(r['input_ids']) for r in b) for b in batches]
    padded = [len(b) * max(len(r['input_ids']) for r in b) for b in batches]
    print(
        f'model {args.model}, {n_batches} batches of {args.batch_size} rows, '
        f'{statistics.mean(real) / args.batch_size:.0f} tokens/row on average, '
        f'padding overhead {sum(padded) / sum(real):.2f}x, threads {torch.get_num_threads()}'
    )

    variants: dict[str, Callable[[list[dict]], None]] = {
        'raw transformers+peft (padded)': raw_step_fn(model_dir),
        'TransformersModel (padded)': twinkle_step_fn(model_dir, padding_free=False),
        'TransformersModel (padding-free)': twinkle_step_fn(model_dir, padding_free=True),
    }
    rates = time_interleaved(variants, batches, args.warmup, args.steps, args.rounds)
    report(rates, next(iter(variants)))


def time_interleaved(
    variants: dict[str, Callable[[list[dict]], None]], batches: list[list[dict]], warmup: int, steps: int, rounds: int
) -> dict[str, list[float]]:
    """Real tokens/s of each variant per round: `warmup` untimed batches each, then `rounds` rounds of `steps`
    batches, every variant on the same batches, the order rotated each round."""
    names = list(variants)
    for name in names:  # warmup: allocator, kernels, first-call caches
        for b in batches[:warmup]:
            variants[name](b)
    rates: dict[str, list[float]] = {name: [] for name in names}
    progress = tqdm(total=rounds * len(names), desc='rounds x variants')
    for r in range(rounds):
        timed = batches[warmup + r * steps : warmup + (r + 1) * steps]
        tokens = sum(sum(len(row['input_ids']) for row in b) for b in timed)
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order every round
            start = time.perf_counter()
            for b in timed:
                variants[name](b)
            rates[name].append(tokens / (time.perf_counter() - start))
            progress.update(1)
    progress.close()
    return rates


def report(rates: dict[str, list[float]], baseline: str) -> None:
    base = statistics.median(rates[baseline])
    print(f'{"variant":<36} {"tokens/s (median)":>18} {"ratio":>7}   per round')
    for name, values in rates.items():
        median = statistics.median(values)
        rounds = ' '.join(f'{v:.0f}' for v in values)
        print(f'{name:<36} {median:>18.0f} {median / base:>6.2f}x   {rounds}')


if __name__ == '__main__':
    main()
