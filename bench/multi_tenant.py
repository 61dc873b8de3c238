"""Multi-tenant LoRA: memory and step throughput of `MultiLoraTransformersModel` vs the obvious baselines.

For N tenants (default 1, 4, 16), each with its own rank-r all-linear LoRA, AdamW and a small batch:

(a) peak RSS, each configuration in a fresh subprocess:
    - engine:  one base model + N adapters, N optimizers, mixed steps;
    - peft:    N separate transformers+peft models (the usual way to train N LoRAs at once), one step each;
    - one-adapter engine on the same N-tenant batch (same activations): the "base" the adapters add to.
    Budget (target): engine(N) <= base(N) + (N - 1) x adapter + 10%, where `adapter` is one adapter's
    training bytes (weights + grads + two AdamW moments, fp32) and base(N) already holds one adapter.
(b) step throughput, measured in this process (tenant-steps/s, median of `--repeats` steps):
    - mixed:       ONE forward_backward pass over all tenants' rows (pass_strategy='mixed', no token cap), then
                   each tenant's clip_grad_and_step;
    - sequential:  the same engine, tenants one after another (adapter switching);
    - peft:        N separate peft models, one after another (raw HF loop: model(labels=...).loss);
    - chosen:      the engine's default (pass_strategy='auto'): the `PassPlanner` picks one mixed pass, groups
                   of tenants or one by one from measured cost. Timed after it settled (warm-up steps until two
                   steps in a row did not explore a new pass size; at most 12).
    `--grid` runs (b) for every tenants x shape cell (`--shapes ROWSxTOKENS ...`) and prints which strategy the
    planner chose and `chosen/best`, the chosen strategy's throughput over the better of sequential and peft.

`--device` (default cuda when available, else cpu): on CUDA the models are bfloat16 (LoRA weights and AdamW state
stay fp32), timers synchronize the GPU, `--threads` is ignored unless given, (a) reports each child's peak GPU
memory (`torch.cuda.max_memory_allocated`) instead of RSS, and the peft xN baseline is left out (n/a) where N
copies of the base model would not fit in free GPU memory (or a cell runs out of memory). `--json PATH` writes
the results as one JSON object (rewritten after every row, so a run cut short keeps what it measured).

Run: .venv/bin/python bench/multi_tenant.py [--model tiny|small|medium] [--tenants 1 4 16] [--rows 2] [--tokens 32]
     [--ranks 8 [32 ...]] [--repeats 5] [--threads 1] [--skip-memory] [--skip-throughput] [--device cpu|cuda]
     [--json PATH]
     .venv/bin/python bench/multi_tenant.py --grid [--model small] [--tenants 1 4 16 64]
     [--shapes 1x16 4x64 8x256] [--ranks 8 32] [--max-step-tokens 16384]
     GPU: python bench/multi_tenant.py --grid --model medium --tenants 16 64 --shapes 1x64 2x128 --repeats 3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable

from multi_tenant_setup import (
    adapter_train_mb,
    build_engine,
    dtype_for,
    make_rows,
    mixed_step,
    padded,
    peft_models,
    peft_step,
    sequential_step,
    sync,
)

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')


# ---- (a) memory, one configuration per fresh process ------------------------------------------------------
def child(kind: str, model_dir: str, n: int, rows: int, tokens: int, ranks: list[int], device: str = 'cpu') -> None:
    data = {f't{i}': make_rows(rows, tokens, seed=i) for i in range(n)}
    if kind == 'engine':  # one pass per step, like `one_adapter` (same activations)
        engine = build_engine(model_dir, n, ranks, device, pass_strategy='mixed', max_pass_tokens=None)
        for _ in range(3):
            mixed_step(engine, data)
    elif kind == 'one_adapter':  # same rows and activations, a single adapter for all of them
        engine = build_engine(model_dir, 1, ranks, device)
        for _ in range(3):
            mixed_step(engine, {'t0': [r for rs in data.values() for r in rs]})
    elif kind == 'peft':
        models = peft_models(model_dir, n, ranks, device)
        batches = [padded(rs, device) for rs in data.values()]
        for _ in range(3):
            peft_step(models, batches)
    else:
        raise SystemExit(f'unknown child kind {kind!r}')
    if device.startswith('cuda'):
        import torch

        print(json.dumps({'peak_mb': torch.cuda.max_memory_allocated() / 2**20}))
    else:
        print(json.dumps({'peak_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def measure_rss(kind: str, model_dir: str, n: int, args: argparse.Namespace) -> float | None:
    """Peak RSS (CPU) or peak GPU memory allocated (CUDA), MB, of `kind` in a fresh process; None where the
    child failed on CUDA (out of memory, typically: N peft copies of a large model)."""
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            '--child',
            kind,
            '--n',
            str(n),
            '--model-dir',
            model_dir,
            '--rows',
            str(args.rows),
            '--tokens',
            str(args.tokens),
            '--threads',
            str(args.threads),
            '--device',
            args.device,
            '--ranks',
            *map(str, args.ranks),
        ],
        check=args.device == 'cpu',
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ['no output'])[-1]
        print(f'    {kind} N={n}: child failed ({last[:160]})', flush=True)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])['peak_mb']


# ---- (b) throughput, in this process --------------------------------------------------------------------
def _median_times(steps: dict[str, Callable[[], None]], repeats: int, device: str = 'cpu') -> dict[str, float]:
    """Median seconds per call of each step; the steps run round-robin so that load from other processes on
    a shared machine hits all of them alike."""
    for step in steps.values():
        step()  # warm-up (allocations, optimizer state)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            sync(device)
            start = time.perf_counter()
            step()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def settle(engine, data: dict[str, list[dict]], max_steps: int = 12) -> int:
    """Train until the planner ran two steps in a row without exploring a new pass size; returns the steps."""
    calm = 0
    for step in range(1, max_steps + 1):
        mixed_step(engine, data)
        calm = 0 if engine.planner.last_plan.exploring else calm + 1
        if calm == 2:
            return step
    return max_steps


def describe(plan) -> str:
    """The planner's choice in a few characters, e.g. ``groups:8x512`` (8 passes of at most 512 tokens)."""
    if plan.strategy == 'groups':
        return f'groups:{len(plan.groups)}x{plan.budget}'
    return plan.strategy


def throughput(model_dir: str, n: int, rows: int, tokens: int, args: argparse.Namespace) -> dict[str, float | str]:
    """Tenant-steps/s of each strategy (no 'peft' key where the peft xN baseline does not fit, CUDA only)."""
    device = args.device
    data = {f't{i}': make_rows(rows, tokens, seed=i) for i in range(n)}
    mixed_engine = build_engine(model_dir, n, args.ranks, device, pass_strategy='mixed', max_pass_tokens=None)
    chosen_engine = build_engine(model_dir, n, args.ranks, device)  # the default: pass_strategy='auto'
    settle(chosen_engine, data)
    models = peft_models(model_dir, n, args.ranks, device, check_fit=True)
    batches = [padded(rs, device) for rs in data.values()]
    steps = {
        'mixed': lambda: mixed_step(mixed_engine, data),
        'sequential': lambda: sequential_step(mixed_engine, data),
        'peft': lambda: peft_step(models, batches),
        'chosen': lambda: mixed_step(chosen_engine, data),
    }
    if models is None:
        del steps['peft']
    seconds = _median_times(steps, args.repeats, device)
    out: dict[str, float | str] = {name: n / t for name, t in seconds.items()}
    out['strategy'] = describe(chosen_engine.planner.last_plan)
    return out


def _free_gpu(device: str) -> None:
    """Release the previous cell's models (engines hold reference cycles) before the next one loads."""
    if device.startswith('cuda'):
        import torch

        gc.collect()
        torch.cuda.empty_cache()


def print_throughput(args: argparse.Namespace, model_dir: str, report: dict) -> None:
    print('\n(b) throughput (tenant-steps/s, median), same process; best = max(sequential, peft)')
    print(
        f'{"N":>3} {"rows x tokens":>13} {"mixed":>8} {"sequential":>10} {"peft xN":>8} {"chosen":>8} '
        f'{"strategy":>16} {"chosen/best":>11} {"mixed/sequential":>16}'
    )
    cells = report['throughput'] = []
    for n in args.tenants:
        for rows, tokens in args.shapes:
            cell: dict = {'tenants': n, 'rows': rows, 'tokens': tokens, 'tokens_per_step': n * rows * tokens}
            cells.append(cell)
            if n * rows * tokens > args.max_step_tokens:
                print(
                    f'{n:>3} {f"{rows} x {tokens}":>13}   skipped: {n * rows * tokens} tokens per step > '
                    f'--max-step-tokens {args.max_step_tokens}',
                    flush=True,
                )
                cell['skipped'] = f'tokens per step > --max-step-tokens {args.max_step_tokens}'
                _write_json(args, report)
                continue
            try:
                r = throughput(model_dir, n, rows, tokens, args)
            except Exception as exc:  # CUDA out of memory: report the cell, go on with the next one
                if not (args.device.startswith('cuda') and 'out of memory' in str(exc).lower()):
                    raise
                r = None
            _free_gpu(args.device)
            if r is None:
                print(f'{n:>3} {f"{rows} x {tokens}":>13}   skipped: CUDA out of memory', flush=True)
                cell['skipped'] = 'CUDA out of memory'
                _write_json(args, report)
                continue
            peft = r.get('peft')
            best = max(r['sequential'], peft) if peft is not None else r['sequential']
            peft_text = f'{peft:>8.2f}' if peft is not None else f'{"n/a":>8}'
            print(
                f'{n:>3} {f"{rows} x {tokens}":>13} {r["mixed"]:>8.2f} {r["sequential"]:>10.2f} '
                f'{peft_text} {r["chosen"]:>8.2f} {r["strategy"]:>16} {r["chosen"] / best:>11.2f} '
                f'{r["mixed"] / r["sequential"]:>16.2f}',
                flush=True,
            )
            per_step = rows * tokens  # tokens per tenant-step
            for name in ('mixed', 'sequential', 'peft', 'chosen'):
                value = r.get(name)
                cell[name] = {
                    'tenant_steps_per_s': value,
                    'tokens_per_s': value * per_step if value is not None else None,
                }
            cell['best'] = {
                'of': 'max(sequential, peft)' if peft is not None else 'sequential (peft xN does not fit)',
                'tenant_steps_per_s': best,
                'tokens_per_s': best * per_step,
            }
            cell['strategy'] = r['strategy']
            cell['chosen_over_best'] = r['chosen'] / best
            cell['mixed_over_sequential'] = r['mixed'] / r['sequential']
            _write_json(args, report)


def _write_json(args: argparse.Namespace, report: dict) -> None:
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(report, f, indent=2)
            f.write('\n')


def _shape(text: str) -> tuple[int, int]:
    try:
        rows, tokens = (int(v) for v in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'shape {text!r} is not ROWSxTOKENS, e.g. 4x64') from None
    return rows, tokens


def main() -> None:
    from twinkle_core.fixtures.tiny_model import SPECS, ensure_tiny_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', default='tiny', choices=list(SPECS), help='fixture size (medium: ~0.8B, GPUs)')
    parser.add_argument('--tenants', type=int, nargs='+', default=[1, 4, 16])
    parser.add_argument('--rows', type=int, default=2, help='rows per tenant per step')
    parser.add_argument('--tokens', type=int, default=32, help='tokens per row')
    parser.add_argument('--ranks', type=int, nargs='+', default=[8], help='LoRA ranks, dealt round-robin')
    parser.add_argument(
        '--grid', action='store_true', help='throughput over tenants x --shapes (implies --skip-memory)'
    )
    parser.add_argument(
        '--shapes',
        type=_shape,
        nargs='+',
        default=None,
        help='ROWSxTOKENS per tenant for --grid (default 1x16 4x64 8x256)',
    )
    parser.add_argument(
        '--max-step-tokens',
        type=int,
        default=16384,
        help='skip grid cells with more tokens per step (the mixed baseline holds them all in one pass)',
    )
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument(
        '--threads',
        type=int,
        default=None,
        help='torch intra-op threads (default 1 on CPU: stable on shared CPUs; on CUDA left as torch sets it)',
    )
    parser.add_argument('--device', default=None, help='cpu or cuda (default: cuda when available, else cpu)')
    parser.add_argument('--json', metavar='PATH', help='also write the results to PATH as one JSON object')
    parser.add_argument('--skip-memory', action='store_true')
    parser.add_argument('--skip-throughput', action='store_true')
    parser.add_argument('--child', help=argparse.SUPPRESS)
    parser.add_argument('--n', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--model-dir', help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    if args.device is None:
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.device == 'cpu' and args.threads is None:
        args.threads = 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    else:
        args.threads = torch.get_num_threads()
    if args.child:
        return child(args.child, args.model_dir, args.n, args.rows, args.tokens, args.ranks, args.device)
    model_dir = str(ensure_tiny_model(args.model))
    if args.grid:
        args.skip_memory = True
        args.shapes = args.shapes or [(1, 16), (4, 64), (8, 256)]
    else:
        args.shapes = [(args.rows, args.tokens)]
        args.max_step_tokens = max(args.max_step_tokens, max(args.tenants) * args.rows * args.tokens)
    cuda = args.device.startswith('cuda')
    where = f'{torch.cuda.get_device_name(torch.device(args.device))}, bfloat16' if cuda else 'CPU'
    print(
        f'model={args.model} tenants={args.tenants} shapes (rows x tokens per tenant)='
        f'{[f"{r}x{t}" for r, t in args.shapes]} ranks={args.ranks} all-linear, AdamW; torch {torch.__version__}, '
        f'{torch.get_num_threads()} threads, {where}'
    )
    report: dict = {
        'bench': 'multi_tenant',
        'argv': sys.argv[1:],
        'model': args.model,
        'device': args.device,
        'device_name': torch.cuda.get_device_name(torch.device(args.device)) if cuda else 'CPU',
        'dtype': str(dtype_for(args.device)).removeprefix('torch.'),
        'torch': torch.__version__,
        'threads': torch.get_num_threads(),
        'tenants': args.tenants,
        'shapes': [f'{r}x{t}' for r, t in args.shapes],
        'ranks': args.ranks,
        'repeats': args.repeats,
        'grid': args.grid,
        'max_step_tokens': args.max_step_tokens,
    }
    if not args.skip_memory:
        adapter = adapter_train_mb(model_dir, args.ranks, args.device)
        _free_gpu(args.device)
        metric = 'peak GPU memory allocated (MB, torch.cuda.max_memory_allocated)' if cuda else 'peak RSS (MB)'
        print(f'\n(a) {metric}, fresh process each; one adapter trains with {adapter:.1f} MB')
        print(
            f'{"N":>3} {"engine":>9} {"peft xN":>9} {"base(N)":>9} {"budget":>9} {"engine/budget":>14} '
            f'{"peft/engine":>12}'
        )
        rows_out = []
        report['memory'] = {
            'metric': 'cuda_max_memory_allocated_mb' if cuda else 'peak_rss_mb',
            'adapter_train_mb': adapter,
            'rows': rows_out,
        }
        for n in args.tenants:
            ours, peft = measure_rss('engine', model_dir, n, args), measure_rss('peft', model_dir, n, args)
            base = measure_rss('one_adapter', model_dir, n, args)
            budget = (base + (n - 1) * adapter) * 1.10 if base is not None else None
            rows_out.append(
                {
                    'tenants': n,
                    'engine_mb': ours,
                    'peft_mb': peft,
                    'base_mb': base,
                    'budget_mb': budget,
                    'engine_over_budget': ours / budget if ours is not None and budget else None,
                    'peft_over_engine': peft / ours if peft is not None and ours else None,
                }
            )
            print(
                f'{n:>3} {_mb(ours, 9)} {_mb(peft, 9)} {_mb(base, 9)} {_mb(budget, 9)} '
                f'{_mb(rows_out[-1]["engine_over_budget"], 14, 2)} {_mb(rows_out[-1]["peft_over_engine"], 12, 2)}',
                flush=True,
            )
            _write_json(args, report)
    if not args.skip_throughput:
        print_throughput(args, model_dir, report)
    _write_json(args, report)


def _mb(value: float | None, width: int, decimals: int = 1) -> str:
    return f'{value:>{width}.{decimals}f}' if value is not None else f'{"n/a":>{width}}'


if __name__ == '__main__':
    main()
