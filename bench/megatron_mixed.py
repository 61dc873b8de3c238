"""Mixed calls on `MegatronModel`: `--tenants` LoRA tenants trained with ONE ``forward_backward({adapter: rows})`` a
step (every tenant's micro-batches in one pipeline schedule) against one call per tenant, the same rows, in the
same process.

Every configuration is N ranks under torchrun (gloo on CPU, one intra-op thread a rank; one process without
torchrun for N = 1) over a `--layouts` mesh: ``one`` (1 rank), ``tp2``, ``pp2`` (two pipeline stages: a call of
one tenant runs pp micro-batches through a pipeline with (pp - 1) stages idle at its start and end; a mixed call
fills it with every tenant's micro-batches), ``dp2``. Each rank trains `--tenants` tenants (rank-8 all-linear LoRA,
AdamW) on `--rows` rows of `--tokens` tokens each a step (split over the data ranks). Reported: tokens/s of the
world (global tokens a step / median step time after `--warmup` steps, forward/backward plus each tenant's
optimizer step) for 'mixed' and 'separate', and their ratio.

Run: python bench/megatron_mixed.py [--model tiny|small] [--layouts one tp2 pp2 dp2] [--tenants 16] [--rows 4]
     [--tokens 64] [--steps 4] [--warmup 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from multi_tenant_setup import make_rows, parse_rank_bench_arguments, run_ranks

LAYOUTS = {'one': (1, {}), 'tp2': (2, {'tp_size': 2}), 'pp2': (2, {'pp_size': 2}), 'dp2': (2, {'dp_size': 2})}
MODES = ('mixed', 'separate')


def worker(args: argparse.Namespace) -> None:
    """One rank of one configuration; rank 0 writes ``{'tokens_per_s'}`` to `--out`."""
    import torch

    torch.set_num_threads(1)
    from twinkle_core.mesh import DeviceMesh, split_for_dp
    from twinkle_core.runtime import distributed
    from twinkle_megatron.model import MegatronModel

    world, sizes = LAYOUTS[args.layout]
    mesh = DeviceMesh.from_sizes(world_size=world, device_type='cpu', **sizes)
    model = MegatronModel(args.model_dir, device_mesh=mesh, distributed_optimizer=False)
    names = [f'tenant{i}' for i in range(args.tenants)]
    for i, name in enumerate(names):
        model.add_adapter_to_model(name, {'r': 8, 'lora_alpha': 16}, seed=i)
        model.set_optimizer('AdamW', lr=1e-4, adapter_name=name)
    dp, dp_rank = mesh.data_world_size, mesh.data_rank(distributed.get_rank())
    times = []
    for step in range(args.warmup + args.steps):
        data = {
            n: split_for_dp(make_rows(args.rows, args.tokens, seed=step * 1000 + i), dp)[dp_rank]
            for i, n in enumerate(names)
        }
        distributed.barrier()
        start = time.perf_counter()
        if args.mode == 'mixed':
            model.forward_backward(inputs=data)
        else:
            for name, rows in data.items():
                model.forward_backward(inputs=rows, adapter_name=name)
        for name in names:
            model.clip_grad_and_step(adapter_name=name)
        distributed.barrier()
        times.append(time.perf_counter() - start)
    if distributed.get_rank() == 0:
        tokens = args.tenants * args.rows * args.tokens
        Path(args.out).write_text(json.dumps({'tokens_per_s': tokens / statistics.median(times[args.warmup :])}))
    model.shutdown()
    distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--layouts', nargs='+', default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument('--layout', default='one', help=argparse.SUPPRESS)
    parser.add_argument('--mode', default='mixed', help=argparse.SUPPRESS)
    args = parse_rank_bench_arguments(parser, warmup=2)
    if args.worker:
        return worker(args)
    results: dict = {'settings': {k: v for k, v in vars(args).items() if k not in ('worker', 'out')}, 'runs': []}
    print(f'{"layout":>6} {"mixed tok/s":>12} {"separate tok/s":>15} {"mixed/separate":>15}', flush=True)
    for layout in args.layouts:
        world = LAYOUTS[layout][0]
        by = {m: run_ranks(__file__, world, args, '--layout', layout, '--mode', m)['tokens_per_s'] for m in MODES}
        results['runs'].append({'layout': layout, **by, 'ratio': by['mixed'] / by['separate']})
        print(
            f'{layout:>6} {by["mixed"]:>12.0f} {by["separate"]:>15.0f} {by["mixed"] / by["separate"]:>15.2f}',
            flush=True,
        )
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == '__main__':
    main()
