"""LoRA SFT speed against Hugging Face TRL's `SFTTrainer`, on the same model, rows, batches, LoRA and optimizer.

Each (implementation, padding) runs in a fresh process per round -- ours in this environment, TRL in its own
(``--trl-python``: a virtual environment with trl, e.g. ``python -m venv trl-env && trl-env/bin/pip install
torch==2.13.0 transformers==5.19.0 peft==0.21.2 accelerate datasets trl``; TRL is not a dependency of this
project) -- on the same batches of self-cognition rows (1..`--max-turns` turns, loss on the answers only), in the
same order (TRL's sampler set to sequential): `--warmup` untimed steps, then `--steps` timed ones; real (non-pad)
tokens per second and the process's peak RSS. Rounds alternate the order of the processes; the median over rounds
is reported, with ours / TRL for the same padding. Gradient checkpointing is the same for both: off unless
``--gradient-checkpointing`` (TRL's `SFTConfig` turns it on by default; it is set explicitly here).

    python bench/sft_vs_trl.py --trl-python trl-env/bin/python                       # SmolLM2-135M-Instruct
    python bench/sft_vs_trl.py --trl-python trl-env/bin/python --model tiny --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from trl_compare import add_common_flags, model_dir, peak_rss_mib, run_child, trl_run_settings

LORA = {'r': 16, 'lora_alpha': 32, 'target_modules': 'all-linear', 'lora_dropout': 0.0}
LR = 1e-4
RUNS = {  # name -> (implementation, padding-free)
    'twinkle padding-free': ('ours', True),
    'twinkle padded': ('ours', False),
    'TRL padding-free': ('trl', True),
    'TRL padded': ('trl', False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_common_flags(parser, steps=8, warmup=2, rounds=3)
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--max-turns', type=int, default=3)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--padding-free', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--batches', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        batches = json.loads(Path(args.batches).read_text())
        step = ours_steps if args.child == 'ours' else trl_steps
        print(json.dumps(step(args.model, batches, args.warmup, args.padding_free, args.gradient_checkpointing)))
        return
    args.model_dir, batches = prepare(args)
    rates: dict[str, list[float]] = {name: [] for name in RUNS}
    peaks: dict[str, list[float]] = {name: [] for name in RUNS}
    names = list(RUNS)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / 'batches.json'
        path.write_text(json.dumps(batches))
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                implementation, padding_free = RUNS[name]
                extra = ['--batches', str(path)] + (['--padding-free'] if padding_free else [])
                result = run_child(__file__, implementation, args, extra)
                rates[name].append(result['tokens_per_s'])
                peaks[name].append(result['peak_rss_mib'])
                print(
                    f'round {r + 1}: {name:<22} {result["tokens_per_s"]:8.0f} tokens/s, '
                    f'peak RSS {result["peak_rss_mib"]:.0f} MiB',
                    flush=True,
                )
    report(rates, peaks, args, args.model_dir)


def prepare(args: argparse.Namespace) -> tuple[str, list[list[dict]]]:
    from sft_throughput import build_batches

    directory = model_dir(args.model)
    batches = build_batches(directory, args.warmup + args.steps, args.batch_size, args.max_turns, args.seed)
    tokens = [sum(len(r['input_ids']) for r in b) for b in batches]
    print(
        f'{directory}: {len(batches)} batches of {args.batch_size} rows, '
        f'{statistics.mean(tokens) / args.batch_size:.0f} tokens/row on average'
    )
    return directory, [[{'input_ids': r['input_ids'], 'labels': r['labels']} for r in b] for b in batches]


def report(rates: dict, peaks: dict, args: argparse.Namespace, model_dir: str) -> None:
    median = {name: statistics.median(v) for name, v in rates.items()}
    peak = {name: max(v) for name, v in peaks.items()}
    print(f'\n{"run":<22} {"tokens/s (median)":>18} {"peak RSS MiB":>13}   per round')
    for name in RUNS:
        print(f'{name:<22} {median[name]:>18.0f} {peak[name]:>13.0f}   {" ".join(f"{v:.0f}" for v in rates[name])}')
    ratios = {
        'padding-free': median['twinkle padding-free'] / median['TRL padding-free'],
        'padded': median['twinkle padded'] / median['TRL padded'],
        'ours best / TRL best': max(median['twinkle padding-free'], median['twinkle padded'])
        / max(median['TRL padding-free'], median['TRL padded']),
    }
    for name, value in ratios.items():
        print(f'twinkle / TRL, {name}: {value:.2f}x')
    if args.json:
        out = {'model': model_dir, 'tokens_per_s': rates, 'peak_rss_mib': peaks, 'ratios': ratios, 'args': vars(args)}
        Path(args.json).write_text(json.dumps(out, indent=1))


# ---- the children: one implementation, `warmup` untimed steps, then the rest timed ---------------------------
def ours_steps(model_dir: str, batches: list[list[dict]], warmup: int, padding_free: bool, checkpointing: bool) -> dict:
    from twinkle_transformers.model import TransformersModel

    model = TransformersModel(model_dir, dtype='float32', gradient_checkpointing=checkpointing)
    model.add_adapter_to_model('default', LORA)
    model.set_processor('CausalLMProcessor', padding_free=padding_free)
    model.set_optimizer('AdamW', lr=LR)
    start = 0.0
    for i, rows in enumerate(batches):
        if i == warmup:
            start = time.perf_counter()
        model.forward_backward(inputs=rows)
        model.clip_grad_and_step(max_norm=1.0)
    return result(batches, warmup, time.perf_counter() - start)


def trl_steps(model_dir: str, batches: list[list[dict]], warmup: int, padding_free: bool, checkpointing: bool) -> dict:
    import datasets
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    rows = [
        {'input_ids': r['input_ids'], 'completion_mask': [int(label != -100) for label in r['labels']]}
        for b in batches
        for r in b
    ]
    clock: dict[str, float] = {}

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                clock['start'] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            clock['end'] = time.perf_counter()

    with tempfile.TemporaryDirectory() as out:
        config = SFTConfig(
            output_dir=out,
            per_device_train_batch_size=len(batches[0]),
            train_sampling_strategy='sequential',
            padding_free=padding_free,
            completion_only_loss=True,
            max_length=None,
            logging_strategy='no',
            **trl_run_settings(lr=LR, steps=len(batches), gradient_checkpointing=checkpointing),
        )
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype='float32')
        trainer = SFTTrainer(
            model=model,
            args=config,
            train_dataset=datasets.Dataset.from_list(rows),
            peft_config=LoraConfig(task_type='CAUSAL_LM', **LORA),
            callbacks=[Timer()],
        )
        trainer.train()
    return result(batches, warmup, clock['end'] - clock['start'])


def result(batches: list[list[dict]], warmup: int, seconds: float) -> dict:
    tokens = sum(len(r['input_ids']) for b in batches[warmup:] for r in b)
    return {'tokens_per_s': tokens / seconds, 'seconds': seconds, 'peak_rss_mib': peak_rss_mib()}


if __name__ == '__main__':
    main()
