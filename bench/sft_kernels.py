"""LoRA SFT tokens/s with and without the first-party CPU kernels, in one process: TransformersModel
(padding-free) plain, with `RMSNorm`, and with `RMSNorm` + `SwiGLUMLP` -- each kernel loaded by name from the
pinned hub repos (an offline Hugging Face cache filled from this repo's hub/ folder, verified, imported by the
`kernels` library) -- and, on a CUDA machine with liger-kernel, Liger's RMSNorm + SwiGLU. Same rows, same LoRA,
interleaved rounds (order rotated), median reported as the ratio to the plain model. The model runs on the
default device (CUDA when available), in fp32. Then the memory side: bytes of activations autograd keeps for
backward in one forward, per variant.

    python bench/sft_kernels.py                          # small fixture model, CPU
    OMP_NUM_THREADS=1 python bench/sft_kernels.py --model tiny --rounds 5
"""

from __future__ import annotations

import os
import statistics
import tempfile

import torch
from sft_throughput import build_batches, parse_args, report, time_interleaved, twinkle_step_fn

from twinkle_core.fixtures.tiny_model import SPECS, ensure_tiny_model

VARIANTS = {'no kernels': (), 'RMSNorm': ('RMSNorm',), 'RMSNorm + SwiGLUMLP': ('RMSNorm', 'SwiGLUMLP')}
#: on a CUDA machine with liger-kernel installed, Liger's Triton kernels are measured too
LIGER = {'Liger RMSNorm + SwiGLUMLP': ('LigerRMSNorm', 'LigerSwiGLUMLP')}


def main() -> None:
    args = parse_args(__doc__.split('\n')[0])
    cache = tempfile.mkdtemp(prefix='twinkle-kernel-cache-')
    os.environ.update(HF_HUB_CACHE=cache, HF_HUB_OFFLINE='1')
    from twinkle_core.fixtures.hub_cache import install_first_party_kernels

    install_first_party_kernels(cache)
    model_dir = str(ensure_tiny_model(args.model)) if args.model in SPECS else args.model
    torch.manual_seed(args.seed)
    n_batches = args.warmup + args.steps * args.rounds
    batches = build_batches(model_dir, n_batches, args.batch_size, args.max_turns, args.seed)
    print(
        f'model {args.model}, {n_batches} batches of {args.batch_size} rows, '
        f'{statistics.mean(sum(len(r["input_ids"]) for r in b) for b in batches) / args.batch_size:.0f} '
        f'tokens/row on average, threads {torch.get_num_threads()}'
    )
    import importlib.util

    chosen = dict(VARIANTS)
    if torch.cuda.is_available() and importlib.util.find_spec('liger_kernel') is not None:
        chosen.update(LIGER)
    variants = {name: twinkle_step_fn(model_dir, True, kernels) for name, kernels in chosen.items()}
    rates = time_interleaved(variants, batches, args.warmup, args.steps, args.rounds)
    report(rates, 'no kernels')
    print('\nactivations saved for backward (one training forward, 8 x 256 tokens, full fine-tuning):')
    base = saved_for_backward(model_dir, ())
    for name, kernels in chosen.items():
        saved = saved_for_backward(model_dir, kernels)
        print(f'{name:<36} {saved / 2**20:>10.1f} MiB {saved / base:>6.2f}x')


def saved_for_backward(model_dir: str, kernels: tuple[str, ...]) -> int:
    """Bytes of the distinct tensors autograd keeps for backward in one forward of the kernelized HF model."""
    from transformers import AutoModelForCausalLM

    from twinkle_core.kernel import apply_kernels

    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    apply_kernels(model, kernels, device=device)
    ids = torch.randint(0, model.config.vocab_size, (8, 256), generator=torch.Generator().manual_seed(0)).to(device)
    storages: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(input_ids=ids, labels=ids)
    return sum(storages.values())


if __name__ == '__main__':
    main()
