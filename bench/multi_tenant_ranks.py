"""Multi-tenant LoRA on several ranks: base memory per rank and step throughput of `MultiLoraTransformersModel` at
1, 2 and 4 ranks, the frozen base replicated on every rank (``dp``) or sharded across them (``fsdp``, FSDP2).

Every configuration is N ranks under torchrun (gloo on CPU, one intra-op thread a rank) training `--tenants`
tenants (rank-8 all-linear LoRA, AdamW) on the same global rows a step, each tenant's rows split across the ranks:

- base memory per rank: bytes of the frozen base's parameters a rank holds (its shards under FSDP2), over one
  process's; and rank 0's peak RSS;
- tokens/s of the whole world (global tokens a step / median step time after `--warmup` steps), for the pass
  strategies 'mixed', 'one_by_one' and 'auto' (the planner's choice) under dp -- chosen/best = auto over the better
  of the other two -- and for fsdp, where every rank runs one pass per call (no planner: the ranks must run the
  same passes).

On this 2-core machine 4 ranks share 2 cores: the tokens/s there show the overhead, not scaling (a GPU run does).

Run: python bench/multi_tenant_ranks.py [--model tiny|small] [--world 1 2 4] [--tenants 16] [--rows 4]
     [--tokens 64] [--steps 4] [--warmup 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

from multi_tenant_setup import build_engine, make_rows, parse_rank_bench_arguments, run_ranks

STRATEGIES = ('mixed', 'one_by_one', 'auto')


def worker(args: argparse.Namespace) -> None:
    """One rank of one configuration; rank 0 writes ``{'tokens_per_s', 'base_bytes', 'peak_rss_mib'}`` to `--out`."""
    import torch

    torch.set_num_threads(1)
    import twinkle_core
    from twinkle_core.mesh import DeviceMesh, split_for_dp
    from twinkle_core.runtime import distributed

    world = int(os.environ.get('WORLD_SIZE', '1'))
    sizes = {'dp_size': world} if args.layout == 'dp' else {'fsdp_size': world}
    mesh = DeviceMesh.from_sizes(**sizes) if world > 1 else None
    twinkle_core.initialize(mode='local', global_device_mesh=mesh)
    rank = distributed.get_rank()
    engine = build_engine(args.model_dir, args.tenants, [8], pass_strategy=args.strategy, max_pass_tokens=None)
    names = engine.list_adapters()
    times = []
    for step in range(args.warmup + args.steps):
        data = {
            n: split_for_dp(make_rows(args.rows, args.tokens, seed=step * 1000 + i), world)[rank]
            for i, n in enumerate(names)
        }
        distributed.barrier()
        start = time.perf_counter()
        engine.forward_backward(inputs=data)
        for name in names:
            engine.clip_grad_and_step(adapter_name=name)
        distributed.barrier()
        times.append(time.perf_counter() - start)
    adapters = {id(p) for name in names for p in engine.manager.parameters(name)}
    base_bytes = sum(  # after the steps: FSDP2 keeps the root's own weights (embeddings, head) gathered between calls
        (t := p.to_local() if hasattr(p, 'to_local') else p).numel() * t.element_size()
        for p in engine.model.parameters()
        if id(p) not in adapters
    )
    if rank == 0:
        result = {
            'tokens_per_s': args.tenants * args.rows * args.tokens / statistics.median(times[args.warmup :]),
            'base_bytes': base_bytes,
            'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            'pass_stats': dict(engine.planner.stats),
        }
        Path(args.out).write_text(json.dumps(result))
    twinkle_core.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--world', type=int, nargs='+', default=[1, 2, 4])
    parser.add_argument('--layout', default='dp', help=argparse.SUPPRESS)
    parser.add_argument('--strategy', default='auto', help=argparse.SUPPRESS)
    args = parse_rank_bench_arguments(parser, warmup=6)  # 'auto' explores pass sizes in the untimed steps
    if args.worker:
        return worker(args)
    results: dict = {'settings': {k: v for k, v in vars(args).items() if k not in ('worker', 'out')}, 'runs': []}
    one_process_bytes = None
    header = ('ranks', 'layout', 'strategy', 'tokens/s', 'base MiB/rank', 'base/1 proc', 'rss MiB')
    print(' '.join(f'{h:>{w}}' for h, w in zip(header, (5, 6, 10, 9, 13, 11, 8))))
    for world in args.world:
        for layout in ('dp', 'fsdp') if world > 1 else ('dp',):
            for strategy in STRATEGIES if layout == 'dp' else ('mixed',):
                r = run_ranks(__file__, world, args, '--layout', layout, '--strategy', strategy)
                one_process_bytes = one_process_bytes or r['base_bytes']
                row = {'ranks': world, 'layout': layout if world > 1 else 'one', 'strategy': strategy, **r}
                row['base_ratio'] = r['base_bytes'] / one_process_bytes
                results['runs'].append(row)
                print(
                    f'{world:>5} {row["layout"]:>6} {strategy:>10} {r["tokens_per_s"]:>9.0f} '
                    f'{r["base_bytes"] / 2**20:>13.1f} {row["base_ratio"]:>11.2f} {r["peak_rss_mib"]:>8.0f}',
                    flush=True,
                )
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=1))
        by = {
            r['strategy']: r['tokens_per_s'] for r in results['runs'] if r['ranks'] == world and r['layout'] != 'fsdp'
        }
        print(f'      ranks={world}: chosen/best (auto over max(mixed, one_by_one)) = '
              f'{by["auto"] / max(by["mixed"], by["one_by_one"]):.2f}', flush=True)  # fmt: skip


if __name__ == '__main__':
    main()
