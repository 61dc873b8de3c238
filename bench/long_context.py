"""Longest sequence one LoRA SFT step fits in a memory budget: plain vs activation checkpointing vs checkpointing +
chunked loss vs + Ulysses sequence parallelism over 2 ranks, on `TransformersModel` (one padding-free row of random
tokens, every token trained, fp32, AdamW).

Memory: every (configuration, length) runs in a fresh subprocess; a length *fits* when the child's peak RSS
(``ru_maxrss``: torch, the model, optimizer and the step) stays within ``--budget-mib``; a sequence-parallel
configuration runs its ranks under torchrun (gloo), and fits when every rank does. A child whose RSS passes
the budget is killed early (psutil polling). Children run with ``MALLOC_MMAP_THRESHOLD_=65536`` so that freed
tensors go back to the OS and RSS follows live memory (glibc's default keeps freed blocks after the first large
free: RSS then overstates what the step needs, by ~1.5x here; ``--glibc-default-malloc`` measures that instead).
Per configuration the length doubles from ``--start`` until it does not fit, then bisects until the bracket is
within ``--resolution`` (a fraction of the longest fitting length; lengths are multiples of 128).

Throughput: all configurations in one process at a common length (``--time-len``, default: the plain run's
longest), interleaved, order rotated each round, medians; each one's tokens/s at its own longest length comes from
its probe (one step). Sequence-parallel configurations cannot share that process: their time at the common
length is one step in a probe of their own (after a warmup step), and their ranks use one core each.

    OMP_NUM_THREADS=1 python bench/long_context.py                   # small-long fixture, 768 MiB budget, CPU
    OMP_NUM_THREADS=1 python bench/long_context.py --quick --json out.json   # ~2 min: 560 MiB, lengths doubled only
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

LORA = {'r': 16, 'lora_alpha': 32, 'target_modules': 'all-linear'}
SEQUENCE_PARALLEL = '+ sequence parallel (2 ranks)'
#: name -> (gradient_checkpointing, loss, sequence-parallel ranks)
CONFIGS: dict[str, tuple[Any, str, int]] = {
    'plain': (False, 'CrossEntropyLoss', 1),
    'checkpointing': (True, 'CrossEntropyLoss', 1),
    'checkpointing + chunked loss': (True, 'ChunkedCrossEntropyLoss', 1),
    SEQUENCE_PARALLEL: (True, 'ChunkedCrossEntropyLoss', 2),
    'selective checkpointing': ('selective', 'CrossEntropyLoss', 1),  # only with --configs
}
DEFAULT_CONFIGS = f'plain,checkpointing,checkpointing + chunked loss,{SEQUENCE_PARALLEL}'


def step_fn(model_dir: str, config: str) -> Callable[[list[dict]], float]:
    """One LoRA SFT step of `config` on a batch of rows; returns the loss. A sequence-parallel configuration
    needs the process group its ranks were started with (torchrun)."""
    from twinkle_transformers.model import TransformersModel

    checkpointing, loss, ranks = CONFIGS[config]
    mesh = None
    if ranks > 1:
        import twinkle_core
        from twinkle_core.mesh import DeviceMesh

        mesh = DeviceMesh.from_sizes(sp_size=ranks, device_type='cpu')
        twinkle_core.initialize(mode='local', global_device_mesh=mesh)
    model = TransformersModel(model_dir, dtype='float32', gradient_checkpointing=checkpointing, device_mesh=mesh)
    model.add_adapter_to_model('default', LORA)
    model.set_processor('CausalLMProcessor', padding_free=True)
    model.set_loss(loss)
    model.set_optimizer('AdamW', lr=1e-4)

    def step(rows: list[dict]) -> float:
        loss = float(model.forward_backward(inputs=rows)['loss'])
        model.clip_grad_and_step(max_norm=1.0)
        return loss

    return step


def random_row(vocab: int, seq_len: int, seed: int) -> dict:
    """One row of `seq_len` random token ids, every token trained."""
    rng = random.Random(seed)
    ids = [rng.randrange(3, vocab) for _ in range(seq_len)]
    return {'input_ids': ids, 'labels': list(ids)}


def vocab_size(model_dir: str) -> int:
    return json.loads(Path(model_dir, 'config.json').read_text())['vocab_size']


def child(model_dir: str, config: str, seq_len: int, warmup: bool) -> dict | None:
    """Run in the probe subprocess (each rank of it): one step at `seq_len` (after another when `warmup`); the
    peak RSS of the process (the largest of the ranks) and the step's time. Ranks other than 0 return None."""
    import resource

    step = step_fn(model_dir, config)
    row = random_row(vocab_size(model_dir), seq_len, seed=0)
    if warmup:
        step([row])
    start = time.perf_counter()
    step([row])
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    if CONFIGS[config][2] > 1:
        import torch.distributed as dist

        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (peak, elapsed))
        peak, elapsed = (max(v) for v in zip(*gathered))
        rank = dist.get_rank()
        import twinkle_core

        twinkle_core.shutdown()  # a process group left to the interpreter's exit can abort there
        if rank != 0:
            return None
    return {'peak_rss_mib': peak, 'step_s': elapsed}


def probe(
    model_dir: str, config: str, seq_len: int, budget_mib: float, trim: bool = True, warmup: bool = False
) -> dict:
    """`config` at `seq_len` in a fresh subprocess (a torchrun of its ranks when sequence-parallel):
    {'fits', 'peak_rss_mib', 'step_s'}; killed when a process passes the budget. `trim`: a fixed glibc mmap
    threshold (module docstring). `warmup`: time a second step."""
    import psutil

    from twinkle_core.utils.net import free_port

    env = {**os.environ, 'MALLOC_MMAP_THRESHOLD_': '65536'} if trim else dict(os.environ)
    args = [__file__, '--child', config, '--model', model_dir, '--seq-len', str(seq_len)]
    ranks = CONFIGS[config][2]
    if warmup:
        args.append('--warmup')
    if ranks > 1:
        launcher = ['-m', 'torch.distributed.run', '--nproc_per_node', str(ranks)]
        args = [*launcher, '--master_addr', '127.0.0.1', '--master_port', str(free_port()), *args]
        env['OMP_NUM_THREADS'] = '1'
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    handle = psutil.Process(proc.pid)
    polled = 0.0
    while proc.poll() is None:
        try:
            workers = handle.children(recursive=True) if ranks > 1 else [handle]  # not torchrun's launcher
            polled = max([polled, *(w.memory_info().rss / 2**20 for w in workers)])
        except psutil.NoSuchProcess:
            continue
        if polled > budget_mib:
            for worker in handle.children(recursive=True):
                worker.kill()
            proc.kill()
            proc.communicate()
            return {'seq_len': seq_len, 'fits': False, 'peak_rss_mib': polled, 'step_s': None}
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f'{config} at {seq_len} tokens failed:\n{stderr[-3000:]}')
    result = json.loads(stdout.strip().splitlines()[-1])
    return {'seq_len': seq_len, 'fits': result['peak_rss_mib'] <= budget_mib, **result}


def longest(model_dir: str, config: str, budget_mib: float, start: int, resolution: float, trim: bool) -> dict:
    """The longest length that fits: doubling from `start`, then bisection until within `resolution` x it."""
    probes = []

    def fits(n: int) -> bool:
        probes.append(probe(model_dir, config, n, budget_mib, trim))
        p = probes[-1]
        print(f'  {config:<30} {n:>7} tokens  peak {p["peak_rss_mib"]:7.0f} MiB  {"fits" if p["fits"] else "over"}')
        return p['fits']

    lo, hi = 0, start
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > max(lo * resolution, 128):
        mid = (lo + hi) // 2 // 128 * 128
        if mid <= lo:
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    best = max((p for p in probes if p['fits']), key=lambda p: p['seq_len'], default=None)
    return {'longest': lo, 'shortest_over': hi, 'at_longest': best, 'probes': probes}


def time_common(model_dir: str, configs: list[str], seq_len: int, rounds: int, steps: int) -> dict[str, list[float]]:
    """Step seconds of `configs` at `seq_len` per round, interleaved (order rotated), after one warmup step;
    a sequence-parallel configuration: one step after a warmup step, in a probe of its own."""
    row = random_row(vocab_size(model_dir), seq_len, seed=1)
    own = {
        name: [probe(model_dir, name, seq_len, float('inf'), warmup=True)['step_s']]
        for name in configs
        if CONFIGS[name][2] > 1
    }
    steppers = {name: step_fn(model_dir, name) for name in configs if name not in own}
    for step in steppers.values():
        step([row])
    times: dict[str, list[float]] = {name: [] for name in steppers}
    names = list(steppers)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            for _ in range(steps):
                steppers[name]([row])
            times[name].append((time.perf_counter() - start) / steps)
    return {**times, **own}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='small-long', help='fixture size or a model dir')
    parser.add_argument('--budget-mib', type=float, default=768.0, help='peak RSS cap of one step process')
    parser.add_argument('--start', type=int, default=1024, help='first length tried (doubles from there)')
    parser.add_argument('--resolution', type=float, default=0.125, help='bisection stops within this fraction')
    parser.add_argument('--glibc-default-malloc', action='store_true', help='children keep glibc defaults')
    parser.add_argument('--time-len', type=int, default=0, help='common length for step times (0: plain longest)')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--steps', type=int, default=1, help='timed steps per configuration per round')
    parser.add_argument('--configs', default=DEFAULT_CONFIGS, help=f'comma-separated, of: {", ".join(CONFIGS)}')
    parser.add_argument('--quick', action='store_true', help='tiny-long settings for the test (seconds)')
    parser.add_argument('--json', help='write the results here')
    parser.add_argument('--child', help=argparse.SUPPRESS)  # a probe: this configuration ...
    parser.add_argument('--seq-len', type=int, help=argparse.SUPPRESS)  # ... at this length
    parser.add_argument('--warmup', action='store_true', help=argparse.SUPPRESS)  # ... timing a second step
    args = parser.parse_args()
    if args.quick:
        args.budget_mib, args.start, args.resolution, args.rounds = 560.0, 512, 1.0, 1
        args.configs = f'plain,checkpointing,{SEQUENCE_PARALLEL}'
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        result = child(args.model, args.child, args.seq_len, args.warmup)
        if result is not None:
            print(json.dumps(result))
        return
    from twinkle_core.fixtures.tiny_model import SPECS, ensure_tiny_model

    model_dir = str(ensure_tiny_model(args.model)) if args.model in SPECS else args.model
    configs = args.configs.split(',')
    if set(configs) - set(CONFIGS):
        raise SystemExit(f'unknown --configs {sorted(set(configs) - set(CONFIGS))}; choose from {list(CONFIGS)}')
    trim = not args.glibc_default_malloc
    base = probe(model_dir, configs[0], 16, float('inf'), trim)
    print(
        f'model {args.model}, budget {args.budget_mib:.0f} MiB peak RSS, threads {os.environ.get("OMP_NUM_THREADS")}; '
        f'a 16-token step of {configs[0]} peaks at {base["peak_rss_mib"]:.0f} MiB (torch + model + optimizer)'
    )
    found: dict[str, dict] = {}
    for name in configs:
        # --quick: the configurations hold ever less memory, so each search starts where the last one's failed
        start = max([args.start] + [f['shortest_over'] for f in found.values()]) if args.quick else args.start
        found[name] = longest(model_dir, name, args.budget_mib, start, args.resolution, trim)
    plain = found[configs[0]]['longest']
    time_len = args.time_len or plain
    print(f'step time at {time_len} tokens, {args.rounds} rounds interleaved ...')
    times = time_common(model_dir, configs, time_len, args.rounds, args.steps)
    base_s = statistics.median(times[configs[0]])
    results = {}
    print(f'{"configuration":<32} {"longest":>8} {"vs plain":>9} {"tok/s there":>12}   step @{time_len} (vs plain)')
    for name in configs:
        at = found[name]['at_longest']
        median = statistics.median(times[name])
        results[name] = {
            'longest_tokens': found[name]['longest'],
            'vs_plain': found[name]['longest'] / plain if plain else None,
            'peak_rss_mib_at_longest': at['peak_rss_mib'] if at else None,
            'tokens_per_s_at_longest': at['seq_len'] / at['step_s'] if at else None,
            'step_s_at_common': median,
            'step_s_at_common_rounds': times[name],
            'step_time_vs_plain': median / base_s,
            'tokens_per_s_at_common': time_len / median,
            'probes': found[name]['probes'],
        }
        r = results[name]
        tps = f'{r["tokens_per_s_at_longest"]:.0f}' if at else '-'
        print(
            f'{name:<32} {r["longest_tokens"]:>8} {r["vs_plain"] or 0:>8.2f}x {tps:>12}   '
            f'{median:.2f} s ({r["step_time_vs_plain"]:.2f}x)'
        )
    out = {
        'model': args.model,
        'budget_mib': args.budget_mib,
        'malloc_mmap_threshold_fixed': trim,
        'baseline_peak_rss_mib': base['peak_rss_mib'],
        'time_len': time_len,
        'results': results,
    }
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(out, f, indent=2)


if __name__ == '__main__':
    main()
