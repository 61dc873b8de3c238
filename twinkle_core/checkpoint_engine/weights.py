"""Which tensors a weight sync moves, and how a receiver applies them (torch only; PEFT is recognised by its naming,
not imported).

Names on the wire:
- base weights use the plain Hugging Face names (``model.layers.0.self_attn.q_proj.weight``): PEFT's wrapper
  prefix ``base_model.model.`` and the ``.base_layer`` segment are removed, so a plain model and a PEFT-wrapped
  model exchange base weights freely;
- LoRA tensors use PEFT's saved-adapter names (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``,
  the adapter name removed), i.e. exactly what `adapter_model.safetensors` holds.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

import torch

from twinkle_core.errors import InvalidInputError

PEFT_PREFIX = 'base_model.model.'
LORA_PARTS = ('lora_A', 'lora_B', 'lora_embedding_A', 'lora_embedding_B', 'lora_magnitude_vector')


def is_lora_name(name: str) -> bool:
    return any(f'.{part}.' in name or name.endswith(f'.{part}') for part in LORA_PARTS)


def canonical_name(name: str) -> str:
    """A base-weight name of a plain or PEFT-wrapped model -> the plain Hugging Face name."""
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX):]
    return name.replace('.base_layer.', '.')


def base_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Canonical name -> tensor (no copy) for every non-LoRA entry of the state dict."""
    return {canonical_name(n): t for n, t in module.state_dict(keep_vars=True).items() if not is_lora_name(n)}


def lora_adapters(module: torch.nn.Module) -> list[str]:
    """Names of the PEFT LoRA adapters in `module` (empty for a plain model)."""
    config = getattr(module, 'peft_config', None)
    return sorted(config) if isinstance(config, dict) else []


def lora_tensors(module: torch.nn.Module, adapter_name: str) -> dict[str, torch.Tensor]:
    """PEFT-format state dict of one adapter (no copy)."""
    marker = f'.{adapter_name}.'
    out = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        if is_lora_name(name) and marker in name:
            out[_drop_adapter(name, adapter_name)] = tensor
    if not out:
        raise InvalidInputError(f'The model has no LoRA tensors for adapter {adapter_name!r}; '
                                f'adapters: {lora_adapters(module) or "none"}.')
    return out


def _drop_adapter(name: str, adapter_name: str) -> str:
    parts = name.split('.')
    for i, part in enumerate(parts):
        if part in LORA_PARTS and i + 1 < len(parts) and parts[i + 1] == adapter_name:
            return '.'.join(parts[:i + 1] + parts[i + 2:])
    return name


def lora_config_dict(module: torch.nn.Module, adapter_name: str) -> dict[str, Any]:
    """The adapter's LoRA config as a JSON-safe dict (sets become sorted lists, enums their values)."""
    config = module.peft_config[adapter_name]  # type: ignore[index]
    raw = config.to_dict() if hasattr(config, 'to_dict') else dict(vars(config))
    return json.loads(json.dumps(raw, default=lambda v: sorted(v) if isinstance(v, (set, frozenset)) else str(v)))


def merged_tensors(module: torch.nn.Module, adapter_name: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Base weights with adapter `adapter_name` merged in (new tensors; the model is not modified)."""
    deltas: dict[str, torch.Tensor] = {}
    for name, sub in module.named_modules():
        lora_a = getattr(sub, 'lora_A', None)
        if lora_a is not None and adapter_name in lora_a and hasattr(sub, 'get_delta_weight'):
            weight_name = canonical_name(f'{name}.base_layer.weight')
            deltas[weight_name] = sub.get_delta_weight(adapter_name)
    if not deltas:
        raise InvalidInputError(f'Nothing to merge: no LoRA layer holds adapter {adapter_name!r}.')
    with torch.no_grad():
        for name, tensor in base_tensors(module).items():
            delta = deltas.get(name)
            yield name, (tensor.detach() + delta.to(tensor.dtype)) if delta is not None else tensor.detach()


def shares_base(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """True when both modules use the very same storage for every base weight."""
    ta, tb = base_tensors(a), base_tensors(b)
    return ta.keys() == tb.keys() and all(ta[k].data_ptr() == tb[k].data_ptr() for k in ta)


def copy_base_weights(module: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy base weights in place (names plain or PEFT-prefixed); returns how many tensors were copied.
    Unknown names or shape mismatches raise before anything is written for that tensor."""
    targets = base_tensors(module)
    count = 0
    with torch.no_grad():
        for name, tensor in named_tensors:
            key = canonical_name(name)
            target = targets.get(key)
            if target is None:
                close = [k for k in targets if k.split('.')[-2:] == key.split('.')[-2:]][:3]
                raise InvalidInputError(f'load_weights: no base weight named {name!r} in this model'
                                        f'{"; similar: " + ", ".join(close) if close else ""}.')
            if target.shape != tensor.shape:
                raise InvalidInputError(f'load_weights: {name!r} has shape {tuple(tensor.shape)}, the model '
                                        f'expects {tuple(target.shape)}.')
            target.copy_(tensor)
            count += 1
    return count
