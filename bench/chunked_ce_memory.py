"""Peak memory of a vocabulary-sized loss + backward: full logits vs the chunked path from the hidden states.

``--loss ce`` (default): token log-probs, `compute_logps(h @ W.T)` vs `compute_logps_from_hidden`
(ChunkedCrossEntropyLoss, and every logps loss on a large batch). ``--loss gkd``: `GKDLoss` with a real
teacher model (a one-layer Qwen3 of the same vocabulary, run without gradients) from full student and teacher
logits vs from hidden states in chunks (the path GKD takes on a large batch).

Each variant runs in a fresh subprocess; peak RSS growth over the inputs (and the teacher) is reported (CPU), or
peak CUDA memory with ``--device cuda``. Same values and gradients are checked in
tests/transformers/test_cross_entropy.py and tests/rl/test_preference_distill_losses.py.

    python bench/chunked_ce_memory.py --tokens 4096 --vocab 65536 --hidden 512
    python bench/chunked_ce_memory.py --loss gkd
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any


def teacher_model(vocab: int, hidden: int, device: str) -> Any:
    """A one-layer Qwen3 with random weights and the student's vocabulary (the GKD teacher)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        tie_word_embeddings=False,
    )
    return Qwen3ForCausalLM(config).to(device)


def run_variant(variant: str, loss: str, tokens: int, vocab: int, hidden: int, device: str) -> dict:
    import resource

    import torch

    from twinkle_core.loss.gkd import GKDLoss
    from twinkle_transformers.forward import compute_logps, compute_logps_from_hidden

    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, device=device, requires_grad=True)
    w = torch.randn(vocab, hidden, device=device) * 0.02
    targets = torch.randint(0, vocab, (tokens,), device=device)
    teacher = teacher_model(vocab, hidden, device) if loss == 'gkd' else None
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if loss == 'gkd':
        inputs = {
            'labels': targets[None],
            'input_ids': targets[None],
            'position_ids': torch.arange(tokens, device=device)[None],
        }
        outputs: dict[str, Any] = {'logps': torch.zeros(1, tokens, device=device)}
        if variant == 'full_logits':
            outputs['logits'] = (h @ w.T)[None]
        else:
            outputs.update(hidden_states=h[None], output_weight=w)
        value = GKDLoss(teacher_model=teacher)(inputs, outputs)['loss']
    elif variant == 'full_logits':
        value = -compute_logps(h @ w.T, targets).mean()
    else:
        value = -compute_logps_from_hidden(h, w, targets)[0].mean()
    value.backward()
    peak = (
        torch.cuda.max_memory_allocated()
        if device == 'cuda'
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {'variant': variant, 'peak_mib': (peak - base) / 2**20, 'loss': float(value)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--tokens', type=int, default=4096)
    parser.add_argument('--vocab', type=int, default=65536)
    parser.add_argument('--hidden', type=int, default=512)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--loss', default='ce', choices=['ce', 'gkd'])
    parser.add_argument('--variant', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.loss, args.tokens, args.vocab, args.hidden, args.device)))
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
                '--loss',
                args.loss,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full, chunked = results
    print(
        f'loss {args.loss}, tokens {args.tokens}, vocab {args.vocab}, hidden {args.hidden}, device {args.device} '
        f'(one fp32 [T, V] logits tensor: {args.tokens * args.vocab * 4 / 2**20:.0f} MiB)'
    )
    for r in results:
        print(f'{r["variant"]:<22} peak +{r["peak_mib"]:.0f} MiB   loss {r["loss"]:.6f}')
    print(f'chunked / full peak memory: {chunked["peak_mib"] / full["peak_mib"]:.2f}x')


if __name__ == '__main__':
    main()
