"""The wire format of weight sync (torch only; no backend is imported): names, buckets, and LoRA merging.

Names on the wire:
- base weights use the plain Hugging Face names (``model.layers.0.self_attn.q_proj.weight``): PEFT's wrapper
  prefix ``base_model.model.`` and the ``.base_layer`` segment are removed, so a plain model and a PEFT-wrapped
  model exchange base weights freely;
- LoRA tensors use PEFT's saved-adapter names (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``,
  the adapter name removed), i.e. exactly what `adapter_model.safetensors` holds, with the adapter's
  `adapter_config.json` fields as its config.

A `Bucket` is a list of (name, tensor) pairs; models export, engines carry and samplers import buckets, so no side
ever needs the whole model at once. Merging a LoRA into base weights is `merge_peft`, over those names alone.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Iterator, Mapping

import torch

from twinkle_core.errors import InvalidInputError

Bucket = list[tuple[str, torch.Tensor]]

PEFT_PREFIX = 'base_model.model.'
LORA_PARTS = ('lora_A', 'lora_B', 'lora_embedding_A', 'lora_embedding_B', 'lora_magnitude_vector')


def is_lora_name(name: str) -> bool:
    return any(f'.{part}.' in name or name.endswith(f'.{part}') for part in LORA_PARTS)


def canonical_name(name: str) -> str:
    """A base-weight name of a plain or PEFT-wrapped model -> the plain Hugging Face name."""
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX) :]
    return name.replace('.base_layer.', '.')


def lora_adapter_key(name: str, adapter_name: str) -> str:
    """A PEFT model's state-dict key of adapter `adapter_name` -> its saved-adapter key (adapter name removed)."""
    parts = name.split('.')
    for i, part in enumerate(parts):
        if part in LORA_PARTS and i + 1 < len(parts) and parts[i + 1] == adapter_name:
            return '.'.join(parts[: i + 1] + parts[i + 2 :])
    return name


def bucketed(pairs: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[Bucket]:
    """Consecutive runs of `pairs` of at most `bucket_bytes` each (a larger tensor gets a bucket of its own)."""
    bucket: Bucket = []
    size = 0
    for name, tensor in pairs:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def merge_peft(
    base: Iterable[Bucket], config: Mapping[str, Any], adapter: Mapping[str, torch.Tensor]
) -> Iterator[Bucket]:
    """`base` buckets with the LoRA `adapter` (PEFT keys + adapter_config fields) merged in: every adapted weight
    becomes a new tensor ``W + scale * B @ A`` (``(B @ A).T`` for embeddings, transposed for fan_in_fan_out);
    `scale` honours `lora_alpha`, `r`, `rank_pattern`/`alpha_pattern` and `use_rslora`. A weight tied to an
    adapted one (same storage, e.g. `lm_head` and `embed_tokens`) and coming after it gets the merged tensor too.
    Inputs are not changed. Raises when an adapted weight never appears in `base`."""
    deltas = _lora_deltas(config, adapter)
    if not deltas:
        raise InvalidInputError('merge_peft: the adapter has no lora_A/lora_B pairs to merge.')
    pending = set(deltas)
    merged_storage: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}  # tied weights follow their twin
    with torch.no_grad():
        for bucket in base:
            out: Bucket = []
            for name, tensor in bucket:
                delta = deltas.get(name)
                key = (tensor.data_ptr(), tuple(tensor.shape))
                if delta is not None:
                    pending.discard(name)
                    tensor = merged_storage[key] = tensor.detach() + delta().to(
                        device=tensor.device, dtype=tensor.dtype
                    )
                elif key in merged_storage and tensor.numel():
                    tensor = merged_storage[key]
                out.append((name, tensor))
            yield out
    if pending:
        raise InvalidInputError(
            f'merge_peft: the adapter adapts {sorted(pending)[:3]}, which the base weights do not contain.'
        )


def _lora_deltas(config: Mapping[str, Any], adapter: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Base weight name -> a function computing its delta (lazily: one delta in memory at a time)."""
    deltas: dict[str, Any] = {}
    for key, a in adapter.items():
        for a_part, b_part, embedding in (
            ('.lora_A.weight', '.lora_B.weight', False),
            ('.lora_embedding_A', '.lora_embedding_B', True),
        ):
            if not key.endswith(a_part):
                continue
            module = key[: -len(a_part)]
            b = adapter.get(module + b_part)
            if b is None:
                raise InvalidInputError(f'merge_peft: {key} has no matching {module + b_part}.')
            name = canonical_name(module) + '.weight'
            scale = _scale(config, canonical_name(module), a.shape[0])
            transpose = embedding or bool(config.get('fan_in_fan_out'))
            deltas[name] = lambda a=a, b=b, scale=scale, transpose=transpose: _delta(a, b, scale, transpose)
    return deltas


def _delta(a: torch.Tensor, b: torch.Tensor, scale: float, transpose: bool) -> torch.Tensor:
    delta = (b.float() @ a.float()) * scale
    return delta.T if transpose else delta


def _scale(config: Mapping[str, Any], module: str, rank: int) -> float:
    alpha = float(_pattern_value(config.get('alpha_pattern') or {}, module, config.get('lora_alpha', 8)))
    return alpha / (math.sqrt(rank) if config.get('use_rslora') else rank)


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """PEFT's rank/alpha pattern lookup: the first key that matches the end of the module name."""
    for key, value in patterns.items():
        if re.match(rf'(.*\.)?({key})$', module):
            return value
    return default
