"""LoRA SFT on one device: teach a model that it is "Twinkle", built by ModelScope.

A plain top-to-bottom loop: data set -> self-cognition preprocessing -> chat template -> encode -> DataLoader
-> TransformersModel with a LoRA adapter -> forward_backward / clip_grad_and_step -> metrics -> save. Then a
greedy answer to "who are you?" checks that the identity was learned.

    python examples/sft_lora.py                      # tiny offline fixture model, local data, CPU: < 1 minute
    torchrun --nproc_per_node 2 examples/sft_lora.py --runtime torchrun [--strategy fsdp]   # DDP / FSDP2
    python examples/sft_lora.py --runtime ray --ranks 2 [--strategy sp]   # 2 Ray actors (sp: split sequences)
    python examples/sft_lora.py --runtime ray --ranks 2 --strategy ep   # a MoE model, each rank half its experts
    python examples/sft_lora.py --model ms://Qwen/Qwen3-0.6B --lr 1e-4 --lora-targets all-linear  # a real model
    python examples/sft_lora.py --model "$(twinkle fixtures smollm2)" --lr 1e-3 --lora-targets all-linear \
        --steps 40 --replay 120 --eval-every 10 --eval-task SelfCognitionTask,ArithmeticTask
        # SmolLM2 from a PyPI wheel: held-out identity questions learned, held-out arithmetic kept
        # (--replay: the base model's own answers to other prompts mixed in; docs/benchmarks.md)
The script is the same in every runtime: only `init_runtime` (the ``twinkle_core.initialize`` call) differs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from tqdm import tqdm

import twinkle_core
from twinkle_core.dataset import DataLoader, Dataset, DatasetMeta
from twinkle_core.fixtures import data_path
from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_core.fixtures.tiny_moe_model import ensure_tiny_moe_model
from twinkle_core.mesh import DeviceGroup, DeviceMesh
from twinkle_core.runtime.distributed import is_main_process
from twinkle_transformers.model import TransformersModel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', default=None, help='model dir or ms:// / hf:// id (default: the tiny fixture)')
    parser.add_argument('--data', default=str(data_path('self_cognition.jsonl')), help='self-cognition jsonl')
    parser.add_argument('--steps', type=int, default=100, help='optimizer steps')
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--lr', type=float, default=3e-3)
    parser.add_argument('--lora-rank', type=int, default=16)
    parser.add_argument(
        '--lora-targets',
        default='all-linear,lm_head',
        help="comma-separated module names, or 'all-linear' (every linear layer but the output "
        "head). The default also adapts lm_head: the tiny fixture's frozen, randomly initialised "
        'output layer otherwise caps how confident it can get',
    )
    parser.add_argument('--padding-free', action='store_true', help='pack each batch into one row')
    parser.add_argument('--log-every', type=int, default=20, help='report metrics every N steps')
    parser.add_argument(
        '--eval-every',
        type=int,
        default=0,
        help='score the adapter on --eval-task every N steps and at the end (0: never); the metrics go to every '
        'metrics logger (the JSONL the console reads) as eval/<task>/<metric>',
    )
    parser.add_argument(
        '--eval-task',
        default='SelfCognitionTask',
        help='evaluation tasks by registry name, comma-separated (e.g. SelfCognitionTask,ArithmeticTask: what is '
        'learned and what must be kept); each is scored before the first step too',
    )
    parser.add_argument('--eval-limit', type=int, default=None, help='score at most N problems of each task')
    parser.add_argument(
        '--replay',
        type=int,
        default=0,
        help='mix N conversations in which the base model answers other prompts in its own words (general '
        'instructions, then training-split arithmetic; greedy, before training) into the data: they hold its '
        'behaviour where the identity data would otherwise take over every answer (local runtime only)',
    )
    parser.add_argument('--output-dir', default='output/sft_lora')
    parser.add_argument(
        '--threads',
        type=int,
        default=None,
        help='CPU intra-op threads (default: 1 for the tiny fixture, whose small matmuls gain '
        "nothing from more and suffer badly on a busy machine; torch's default otherwise)",
    )
    parser.add_argument('--runtime', choices=['local', 'torchrun', 'ray'], default='local')
    parser.add_argument('--ranks', type=int, default=2, help='ray: actors in the model group')
    parser.add_argument(
        '--strategy',
        choices=['dp', 'fsdp', 'sp', 'ep'],
        default='dp',
        help='across ranks: DDP, FSDP2, Ulysses sequence parallelism (every rank takes a slice of each row), or '
        'expert parallelism (a mixture-of-experts model, default the tiny Qwen3-MoE fixture: every rank holds '
        '1/N of the experts, with DDP for the rest; also picks that model in one process)',
    )
    return parser.parse_args()


def init_runtime(runtime: str, ranks: int, strategy: str) -> None:
    """The one place where the runtimes differ (docs/runtimes.md)."""
    world = int(os.environ.get('WORLD_SIZE', 1)) if runtime == 'torchrun' else ranks
    sizes = {'dp_size': world, 'ep_size': world} if strategy == 'ep' else {f'{strategy}_size': world}
    mesh = DeviceMesh.from_sizes(**sizes)
    if runtime == 'ray':
        twinkle_core.initialize(mode='ray', groups=[DeviceGroup(name='model', ranks=ranks)], global_device_mesh=mesh)
    elif runtime == 'torchrun':
        twinkle_core.initialize(mode='local', global_device_mesh=mesh)
    else:
        twinkle_core.initialize(mode='local')
        return
    if is_main_process():
        print(f'training on {runtime} over {mesh!r}', flush=True)


def main() -> None:
    args = parse_args()
    if 'TWINKLE_METRICS_JSONL' not in os.environ:  # the logged metrics, for `twinkle console --logdir output/`
        metrics_file = Path(args.output_dir) / 'metrics.jsonl'
        metrics_file.unlink(missing_ok=True)  # this run's curve only
        os.environ['TWINKLE_METRICS_JSONL'] = str(metrics_file)
    init_runtime(args.runtime, args.ranks, args.strategy)
    model_id = args.model or str(ensure_tiny_moe_model() if args.strategy == 'ep' else ensure_tiny_model('tiny'))
    threads = args.threads or (1 if args.model is None else None)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)

    # Data: rows {query, response} -> chat messages naming the model -> input_ids + assistant-only labels.
    identity = DatasetMeta(args.data)
    parts = [identity]
    if args.replay:
        if args.runtime != 'local':
            raise SystemExit('--replay samples the base model in this process: local runtime only')
        parts.append(DatasetMeta(str(replay_file(model_id, args.replay, Path(args.output_dir) / 'replay.jsonl'))))
    dataset = Dataset(parts, mixing='concat')
    dataset.map(
        'SelfCognitionProcessor',
        init_args={'model_name': 'Twinkle', 'model_author': 'ModelScope'},
        dataset_meta=identity,
    )
    dataset.set_template('Template', model_id=model_id, max_length=512)
    dataset.encode()
    # lazy_collect: on Ray, batches stay in the model group (handed rank to rank to forward_backward)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, seed=0, remote_group='model', lazy_collect=True
    )

    # Model: frozen base + one LoRA adapter, with its optimizer and schedule.
    model = TransformersModel(model_id=model_id, remote_group='model')  # local runtimes ignore remote_group
    model.add_adapter_to_model(
        'default',
        {'r': args.lora_rank, 'lora_alpha': 2 * args.lora_rank, 'target_modules': lora_targets(args.lora_targets)},
    )
    model.set_template('Template')
    model.set_processor('CausalLMProcessor', padding_free=args.padding_free)
    model.set_optimizer('AdamW', lr=args.lr, weight_decay=0.0)
    model.set_lr_scheduler('CosineWarmupScheduler', num_warmup_steps=5, num_training_steps=args.steps, min_lr_ratio=0.1)

    first_loss, metrics = None, {}
    main_rank = is_main_process()  # under torchrun, rank 0 reports
    evaluator = make_evaluator(model, model_id, args) if main_rank and args.eval_every else None
    progress = tqdm(total=args.steps, desc='sft', unit='step', file=None if main_rank else open(os.devnull, 'w'))
    if evaluator is not None:  # the untrained adapter (LoRA starts as the identity): the curve's first point
        report_eval(progress, 0, evaluator(0))
    while progress.n < args.steps:
        for batch in loader:
            out = model.forward_backward(inputs=batch)
            model.clip_grad_and_step(max_norm=1.0)
            first_loss = out['loss'] if first_loss is None else first_loss
            progress.update(1)
            progress.set_postfix(loss=f'{out["loss"]:.3f}')
            if progress.n % args.log_every == 0 or progress.n == args.steps:
                metrics = model.calculate_metric(is_training=True)
                if main_rank:
                    progress.write(
                        f'step {progress.n}: loss {metrics["loss"]:.4f}  '
                        f'acc {metrics["token_accuracy"]:.3f}  '
                        f'grad_norm {metrics["grad_norm"]:.3f}  lr {metrics["lr"]:.2e}  '
                        f'{metrics["tokens_per_second"]:.0f} tok/s'
                    )
            if evaluator is not None and (progress.n % args.eval_every == 0 or progress.n == args.steps):
                report_eval(progress, progress.n, evaluator(progress.n))
            if progress.n == args.steps:
                break
    progress.close()
    path = model.save('final', output_dir=args.output_dir)
    twinkle_core.shutdown()
    if not main_rank:
        return
    print(f'saved LoRA adapter to {Path(path).resolve()}')

    # Check: the final loss is far below the first one, and the saved adapter (loaded here, in one process,
    # whatever runtime trained it) answers with its new name.
    trained = TransformersModel(model_id=model_id)
    trained.load(path)
    trained.set_template('Template')
    answer = greedy_answer(trained, 'who are you?')
    print(f'Q: who are you?\nA: {answer}')
    print(f'loss: first step {first_loss:.3f} -> last window {metrics["loss"]:.3f}')
    if metrics['loss'] > 0.3 * first_loss:
        raise SystemExit(
            f'Training did not converge: last loss {metrics["loss"]:.3f} is above 30% of the first '
            f'({first_loss:.3f}). Try more --steps or a higher --lr.'
        )
    if 'Twinkle' not in answer:
        raise SystemExit(
            f'The model did not learn its identity: {answer!r} does not mention "Twinkle". Try more --steps.'
        )


def make_evaluator(model: TransformersModel, model_id: str, args: argparse.Namespace):
    """`evaluate(step)`: the adapter as of now (saved, loaded into a TorchSampler) scored on each `--eval-task`
    (task name -> its metrics); the metrics also go to every metrics logger at that step (`twinkle_core.eval`)."""
    from twinkle_core.eval import evaluate
    from twinkle_transformers.sampler import TorchSampler

    sampler = TorchSampler(model_id)
    eval_dir = Path(args.output_dir) / 'eval'
    tasks = [name.strip() for name in args.eval_task.split(',') if name.strip()]

    def run(step: int) -> dict[str, dict[str, float]]:
        path = model.save('current', output_dir=str(eval_dir))
        sampler.add_adapter('current', path=str(path))
        return {
            task: evaluate(
                sampler, task, adapter_name='current', step=step, limit=args.eval_limit, progress=False
            ).metrics
            for task in tasks
        }

    return run


def replay_file(model_id: str, n: int, out: Path) -> Path:
    """`n` conversations in which the base model answers prompts the identity data does not cover -- the general
    instructions of `alpaca_sample.jsonl`, then training-split arithmetic (`arithmetic_prompts(split='train')`: no
    held-out problem) -- in its own words, greedily, before any training (self-distillation replay); answers cut by
    the token limit are left out. Written to `out` as chat rows."""
    import json

    from twinkle_core.eval.arithmetic import arithmetic_prompts
    from twinkle_core.types import SamplingParams
    from twinkle_transformers.sampler import TorchSampler

    general = [json.loads(line) for line in data_path('alpaca_sample.jsonl').read_text().splitlines() if line]
    prompts = [
        {'messages': [{'role': 'user', 'content': g['instruction'] + (f'\n\n{g["input"]}' if g['input'] else '')}]}
        for g in general
    ][:n]
    prompts += arithmetic_prompts(n - len(prompts), split='train', seed=1) if n > len(prompts) else []
    sampler = TorchSampler(model_id)
    sampler.set_template('Template')
    responses = sampler.sample(prompts, SamplingParams(max_tokens=128, temperature=0.0))
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = 0
    with out.open('w', encoding='utf-8') as f:
        for prompt, response in zip(prompts, responses):
            answer = response.sequences[0]
            if answer.stop_reason == 'stop':
                f.write(json.dumps({'messages': [*prompt['messages'], {'role': 'assistant', 'content': answer.text}]}))
                f.write('\n')
                kept += 1
    if not kept:
        raise SystemExit(
            f"--replay: none of the base model's {len(prompts)} answers ended within 128 tokens (a model with "
            'random weights never stops); replay needs a trained model, e.g. --model "$(twinkle fixtures smollm2)"'
        )
    print(f'replay: {kept} of {len(prompts)} base-model answers (the rest hit the token limit) in {out}')
    return out


def report_eval(progress: tqdm, step: int, results: dict[str, dict[str, float]]) -> None:
    for task, scores in results.items():
        progress.write(
            f'step {step}: {task} accuracy {scores["accuracy"]:.3f} '
            f'[{scores["accuracy_low"]:.3f}, {scores["accuracy_high"]:.3f}]'
        )


def lora_targets(spec: str) -> str | list[str]:
    """'all-linear' (peft's shortcut) and/or module names. 'all-linear' plus extra names (e.g. 'all-linear,lm_head')
    expands to the Qwen/Llama projection layers (q/k/v/o, gate/up/down) plus those names."""
    names = [n.strip() for n in spec.split(',') if n.strip()]
    if 'all-linear' not in names:
        return names
    extra = [n for n in names if n != 'all-linear']
    return (
        'all-linear'
        if not extra
        else ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj', *extra]
    )


def greedy_answer(model: TransformersModel, question: str, max_new_tokens: int = 40) -> str:
    """Greedy decoding with the trained adapter (transformers' `generate` on the underlying module)."""
    template = model.state.template
    prompt = template.encode({'messages': [{'role': 'user', 'content': question}]}, add_generation_prompt=True)
    input_ids = torch.tensor([prompt['input_ids']], device=model.device)
    model.model.eval()
    with torch.no_grad():
        output = model.model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            use_cache=True,
            eos_token_id=template.tokenizer.eos_token_id,
            pad_token_id=template.tokenizer.pad_token_id,
        )
    return template.decode(output[0, input_ids.shape[1] :].tolist())


if __name__ == '__main__':
    main()
