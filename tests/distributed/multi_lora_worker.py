"""One multi-tenant training run of MultiLoraTransformersModel -- in one process, or under torchrun on N data ranks.

    python multi_lora_worker.py --model DIR --out DIR                       # one process
    torchrun --nproc_per_node 2 multi_lora_worker.py --model DIR --out DIR --dp 2
    torchrun --nproc_per_node 2 multi_lora_worker.py --model DIR --out DIR --fsdp 2     # the base sharded (FSDP2)

Three tenants with different LoRA ranks, targets and losses share mixed passes: 'a' (r=4, all-linear, token-mean
cross-entropy), 'b' (r=8, q/v only, sequence-mean cross-entropy, 2 calls a step), 'c' (r=2, all-linear, GRPO).
Each step has the same global rows at every world size; every rank takes its slice of each tenant's rows
(`split_for_dp`: 'b' has 3 rows a step, so ranks hold different numbers of rows). At ``--nan-step`` one row of 'c'
(the last one: on the last rank) carries a NaN advantage: 'c' must be rejected alone, on every rank. Step 1 runs
as ``forward`` -> ``calculate_loss`` -> ``backward``. Writes ``result.json`` (rank 0) and each tenant's checkpoint.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import twinkle_core
from twinkle_core.fixtures import random_token_rows
from twinkle_core.mesh import DeviceMesh, split_for_dp
from twinkle_core.runtime import distributed

PRELOAD = ('torch', 'torch.distributed', 'transformers', 'safetensors.torch', 'twinkle_core.loss')
PRELOAD_PACKAGES = ('twinkle_transformers',)
PRELOAD_SKIP = ('sampler', 'liger')

TENANTS = {  # name: (LoRA settings, loss, loss kwargs, rows a step)
    'a': ({'r': 4, 'lora_alpha': 8, 'target_modules': 'all-linear'}, 'CrossEntropyLoss', {}, 4),
    'b': (
        {'r': 8, 'lora_alpha': 8, 'target_modules': ['q_proj', 'v_proj']},
        'CrossEntropyLoss',
        {'reduction': 'sequence_mean'},
        3,
    ),
    'c': ({'r': 2, 'lora_alpha': 4, 'target_modules': 'all-linear'}, 'GRPOLoss', {}, 4),
}


def step_rows(step: int, nan_step: int) -> dict[str, list[dict]]:
    """The global rows of every tenant at `step` (the same at every world size)."""
    out = {}
    for i, (name, (_, _, _, n)) in enumerate(TENANTS.items()):
        rows = random_token_rows(n, seed=100 * step + i)
        if name == 'c':
            rows = with_advantages(rows, [1.0, -0.5, 0.25, -1.0])
            if step == nan_step:
                rows[-1]['advantage'] = math.nan
        out[name] = rows
    return out


def with_advantages(rows: list[dict], advantages: list[float]) -> list[dict]:
    """`rows` as GRPO rows: behaviour log-probs and a per-row advantage."""
    return [
        {**row, 'old_logps': [0.0] + [-2.0] * (len(row['input_ids']) - 1), 'advantage': advantage}
        for row, advantage in zip(rows, advantages)
    ]


def base_elements(model) -> int:
    """Elements of the frozen base this rank holds (its shards under FSDP2)."""
    adapters = {id(p) for name in model.list_adapters() for p in model.manager.parameters(name)}
    return sum(
        (p.to_local() if hasattr(p, 'to_local') else p).numel()
        for p in model.model.parameters()
        if id(p) not in adapters
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--model', required=True)
    parser.add_argument('--out', required=True)
    parser.add_argument('--dp', type=int, default=1)
    parser.add_argument('--fsdp', type=int, default=1, help='shard the frozen base over this many ranks (FSDP2)')
    parser.add_argument('--steps', type=int, default=3)
    parser.add_argument('--nan-step', type=int, default=2)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    mesh = DeviceMesh.from_sizes(dp_size=args.dp, fsdp_size=args.fsdp)
    twinkle_core.initialize(mode='local', global_device_mesh=mesh if mesh.world_size > 1 else None)
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    rank, world = distributed.get_rank(), distributed.get_world_size()
    torch.manual_seed(rank)  # fresh adapters must start from rank 0's draw whatever each rank's own seed
    model = MultiLoraTransformersModel(args.model, device='cpu', pass_strategy='mixed')
    for name, (lora, loss, kwargs, _) in TENANTS.items():
        model.add_adapter_to_model(name, lora, gradient_accumulation_steps=2 if name == 'b' else 1)
        model.set_loss(loss, adapter_name=name, **kwargs)
        model.set_optimizer('AdamW', lr=1e-2, adapter_name=name)
    losses: dict[str, list] = {name: [] for name in TENANTS}
    grad_norms: dict[str, list] = {name: [] for name in TENANTS}
    errors: dict[str, str] = {}
    for step in range(args.steps):
        rows = {name: split_for_dp(r, world)[rank] for name, r in step_rows(step, args.nan_step).items()}
        if step == 1:
            model.forward(inputs=rows)
            step_losses = model.calculate_loss()
            out = {name: {'loss': loss} for name, loss in step_losses.items()}
            model.backward()
        else:
            out = model.forward_backward(inputs=rows, return_errors=True)
        for name in TENANTS:
            result = out[name]
            losses[name].append(result['loss'] if 'loss' in result else f'rejected: {result["error"]["stage"]}')
            if 'error' in result:
                errors[name] = result['error']['message']
        b_rows = {'b': split_for_dp(random_token_rows(3, seed=7 + step), world)[rank]}
        model.forward_backward(inputs=b_rows)  # 'b' accumulates two calls a step
        for name in TENANTS:
            grad_norms[name].append(model.clip_grad_and_step(max_norm=1.0, adapter_name=name)['grad_norm'])
    eval_rows = {name: random_token_rows(4, seed=99) for name in TENANTS}
    eval_rows['c'] = with_advantages(eval_rows['c'], [0.5] * 4)
    eval_rows = {name: split_for_dp(r, world)[rank] for name, r in eval_rows.items()}
    evaluation = model.forward_only(inputs=eval_rows)
    digests = {name: [float(p.detach().double().sum()) for p in model.manager.parameters(name)] for name in TENANTS}
    all_digests = [None] * world
    if world > 1:
        import torch.distributed as dist

        dist.all_gather_object(all_digests, digests)
    else:
        all_digests = [digests]
    paths = {name: model.save(f'final-{name}', output_dir=args.out, adapter_name=name) for name in TENANTS}
    metrics = {name: model.calculate_metric(adapter_name=name) for name in TENANTS}
    if distributed.is_main_process():
        result = {
            'world_size': world,
            'losses': losses,
            'grad_norms': grad_norms,
            'eval_loss': {name: evaluation[name]['loss'] for name in TENANTS},
            'metrics': {name: {k: m[k] for k in ('loss', 'num_tokens')} for name, m in metrics.items()},
            'digests': all_digests,
            'checkpoints': paths,
            'c_error': errors.get('c'),
            'base_elements_per_rank': base_elements(model),
            'optimizer_steps': {name: model.states[name].optimizer_steps for name in TENANTS},
        }
        Path(args.out, 'result.json').write_text(json.dumps(result))
    twinkle_core.shutdown()


if __name__ == '__main__':
    main()
