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

from typing import Any, Iterable, Iterator

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.utils.json import to_json

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


# Attribute under which twinkle_transformers.multi_lora.MultiLoraManager attaches itself to a model.
MULTI_LORA_ATTR = '_twinkle_multi_lora'


def module_of(model: Any) -> torch.nn.Module:
    """The `torch.nn.Module` behind `model`: itself, or the module a twinkle model/sampler wraps (`.model`)."""
    if isinstance(model, torch.nn.Module):
        return model
    inner = getattr(model, 'model', None)
    if isinstance(inner, torch.nn.Module):
        return inner
    raise InvalidInputError(f'{type(model).__name__} neither is nor wraps (as `.model`) a torch module.')


def lora_adapters(module: torch.nn.Module) -> list[str]:
    """Names of the LoRA adapters in `module` (PEFT or twinkle multi-LoRA); empty for a plain model."""
    manager = getattr(module, MULTI_LORA_ATTR, None)
    if manager is not None:
        return sorted(manager.adapter_names)
    config = getattr(module, 'peft_config', None)
    return sorted(config) if isinstance(config, dict) else []


def adapter_export(module: torch.nn.Module, adapter_name: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(PEFT-format tensors without copies, JSON-safe LoRA config dict) of one adapter."""
    if adapter_name not in lora_adapters(module):
        raise InvalidInputError(f'The model has no LoRA adapter {adapter_name!r}; adapters: '
                                f'{lora_adapters(module) or "none"}.')
    manager = getattr(module, MULTI_LORA_ATTR, None)
    if manager is not None:
        return manager.state_dict(adapter_name), _json_safe(manager.record(adapter_name).config)
    marker = f'.{adapter_name}.'
    tensors = {_drop_adapter(n, adapter_name): t.detach() for n, t in module.state_dict(keep_vars=True).items()
               if is_lora_name(n) and marker in n}
    return tensors, _json_safe(module.peft_config[adapter_name])  # type: ignore[index]


def _drop_adapter(name: str, adapter_name: str) -> str:
    parts = name.split('.')
    for i, part in enumerate(parts):
        if part in LORA_PARTS and i + 1 < len(parts) and parts[i + 1] == adapter_name:
            return '.'.join(parts[:i + 1] + parts[i + 2:])
    return name


def _json_safe(config: Any) -> dict[str, Any]:
    return to_json(config.to_dict() if hasattr(config, 'to_dict') else dict(vars(config)))


def merged_tensors(module: torch.nn.Module, adapter_name: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Base weights with adapter `adapter_name` merged in (new tensors for adapted weights; the model is unchanged)."""
    deltas = _lora_deltas(module, adapter_name)
    if not deltas:
        raise InvalidInputError(f'Nothing to merge: no LoRA layer holds adapter {adapter_name!r}.')
    with torch.no_grad():
        for name, tensor in base_tensors(module).items():
            delta = deltas.get(name)
            yield name, (tensor.detach() + delta.to(tensor.dtype)) if delta is not None else tensor.detach()


def _lora_deltas(module: torch.nn.Module, adapter_name: str) -> dict[str, torch.Tensor]:
    """Canonical weight name -> LoRA delta (scaling * B @ A) of every layer adapter `adapter_name` adapts."""
    manager = getattr(module, MULTI_LORA_ATTR, None)
    slot = manager.slot(adapter_name) if manager is not None else None
    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, sub in module.named_modules():
            weight_name = canonical_name(f'{name}.base_layer.weight')
            if slot is not None and hasattr(sub, 'adapters') and hasattr(sub, 'get'):
                w = sub.get(slot)
                if w is not None:
                    deltas[weight_name] = (w.lora_B.weight.float() @ w.lora_A.weight.float()) * w.scaling
            elif slot is None and adapter_name in (getattr(sub, 'lora_A', None) or {}) and hasattr(
                    sub, 'get_delta_weight'):
                deltas[weight_name] = sub.get_delta_weight(adapter_name)
    return deltas


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
