"""`twinkle eval --model DIR --task NAME [--adapter DIR] ...`: score a model (or a LoRA adapter on it) on an
evaluation task through a sampler, and print the metrics (`twinkle_core.eval`).

    twinkle eval --model "$(twinkle fixtures smollm2)" --task ArithmeticTask --task-args '{"size": 200}'
    twinkle eval --model DIR --adapter output/sft_lora/final --task SelfCognitionTask --json eval.json
    twinkle eval --model DIR --task ArithmeticTask --samples 8 --sampler vLLMSampler      # pass@1..8
"""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser('eval', help='score a model or a LoRA adapter on an evaluation task')
    parser.add_argument('--model', required=True, help='the base model directory (or ms:// / hf:// id)')
    parser.add_argument('--task', required=True, help='an evaluation task by registry name (kind task)')
    parser.add_argument('--task-args', default='{}', metavar='JSON', help="the task's constructor arguments")
    parser.add_argument('--adapter', help='a saved LoRA adapter (PEFT directory) to evaluate on the model')
    parser.add_argument('--sampler', default='TorchSampler', help='sampler by registry name (default TorchSampler)')
    parser.add_argument('--sampler-args', default='{}', metavar='JSON', help="the sampler's constructor arguments")
    parser.add_argument('--samples', type=int, default=1, help='samples per prompt (pass@k for k up to it)')
    parser.add_argument('--limit', type=int, help="the first N of the task's prompts")
    parser.add_argument('--batch-size', type=int, default=16, help='prompts per sampler call')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--json', metavar='FILE', help='also write the metrics and every answer here')
    parser.set_defaults(func=eval_command)


def eval_command(args: argparse.Namespace) -> int:
    from twinkle_core.errors import InvalidInputError
    from twinkle_core.eval import evaluate
    from twinkle_core.registry import resolve

    try:
        task_args, sampler_args = json.loads(args.task_args), json.loads(args.sampler_args)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f'--task-args / --sampler-args must be JSON objects: {exc}') from None
    if args.samples < 1:
        raise InvalidInputError(f'--samples must be >= 1, got {args.samples}')
    task = resolve('task', args.task, **task_args)
    sampler = resolve('sampler', args.sampler, model_id=args.model, **sampler_args)
    adapter = None
    if args.adapter:
        adapter = 'evaluated'
        sampler.add_adapter(adapter, path=args.adapter)
    result = evaluate(
        sampler,
        task,
        adapter_name=adapter,
        num_samples=args.samples,
        limit=args.limit,
        batch_size=args.batch_size,
        seed=args.seed,
    )
    m = result.metrics
    print(
        f'{result.task}: accuracy {m["accuracy"]:.3f} [{m["accuracy_low"]:.3f}, {m["accuracy_high"]:.3f}] over '
        f'{int(m["prompts"])} prompts x {int(m["samples"])}; format {m["format_rate"]:.3f}; '
        f'mean reward {m["mean_reward"]:.3f}; mean length {m["mean_length"]:.1f} tokens'
    )
    for name in sorted(k for k in m if k.startswith('pass@')):
        print(f'  {name}: {m[name]:.3f}')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump({'task': result.task, 'metrics': m, 'records': result.records}, f, indent=1)
    return 0
