"""Peak memory of token log-probs + backward: full logits vs `compute_logps_from_hidden` (ChunkedCrossEntropyLoss).

Each variant runs in a fresh subprocess; peak RSS growth over the inputs is reported (CPU), or peak CUDA memory
with ``--device cuda``. Same values and gradients are checked in tests/transformers/test_cross_entropy.py.

    python bench/chunked_ce_memory.py --tokens 4096 --vocab 65536 --hidden 512
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def run_variant(variant: str, tokens: int, vocab: int, hidden: int, device: str) -> dict:
    import resource

    import torch

    from twinkle_transformers.forward import compute_logps, compute_logps_from_hidden

    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, device=device, requires_grad=True)
    w = torch.randn(vocab, hidden, device=device) * 0.02
    targets = torch.randint(0, vocab, (tokens,), device=device)
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if variant == 'full_logits':
        logps = compute_logps(h @ w.T, targets)
    else:
        logps, _ = compute_logps_from_hidden(h, w, targets)
    (-logps.mean()).backward()
    peak = (
        torch.cuda.max_memory_allocated()
        if device == 'cuda'
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {'variant': variant, 'peak_mib': (peak - base) / 2**20, 'loss': float(-logps.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--tokens', type=int, default=4096)
    parser.add_argument('--vocab', type=int, default=65536)
    parser.add_argument('--hidden', type=int, default=512)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--variant', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.tokens, args.vocab, args.hidden, args.device)))
        return
    results = []
    for variant in ('full_logits', 'chunked_from_hidden'):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                '--variant',
                variant,
                '--tokens',
                str(args.tokens),
                '--vocab',
                str(args.vocab),
                '--hidden',
                str(args.hidden),
                '--device',
                args.device,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full, chunked = results
    print(
        f'tokens {args.tokens}, vocab {args.vocab}, hidden {args.hidden}, device {args.device} '
        f'(one fp32 [T, V] logits tensor: {args.tokens * args.vocab * 4 / 2**20:.0f} MiB)'
    )
    for r in results:
        print(f'{r["variant"]:<22} peak +{r["peak_mib"]:.0f} MiB   loss {r["loss"]:.6f}')
    print(f'chunked / full peak memory: {chunked["peak_mib"] / full["peak_mib"]:.2f}x')


if __name__ == '__main__':
    main()
