"""The export half of the backend seam for Transformers-backed models (docs/architecture.md §5): base weights and
LoRA adapters of a torch module -- a plain Hugging Face model, a PEFT model, or one with twinkle multi-LoRA layers
-- in the wire naming of `twinkle_core.weight_sync.weights` (HF names; PEFT adapter keys), as buckets.

Collective under FSDP2/TP: parameters that are DTensor shards are gathered (`full_tensor()`) one at a time while
iterating, so every rank of the model must iterate the same export to the end; only the export rank (rank 0)
receives tensors, the others get empty buckets and nothing is kept.

    weights = ModuleWeights(peft_model)               # a raw module (tests, custom loops)
    CheckpointEngineManager(model=weights, sampler=sampler).sync_weights()
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.utils.json import to_json
from twinkle_core.weight_sync.weights import Bucket, bucketed, canonical_name, is_lora_name, lora_adapter_key
from twinkle_transformers.multi_lora import find_manager


class ModuleWeights:
    """Export a torch module's weights. `export_rank`: this process is the one that receives full tensors
    (default: rank 0 of torch.distributed, or True without it)."""

    def __init__(self, module: torch.nn.Module, *, export_rank: bool | None = None) -> None:
        self.module = module
        self._export_rank = export_rank

    def list_adapters(self) -> list[str]:
        manager = _multi_lora(self.module)
        if manager is not None:
            return sorted(manager.adapter_names)
        config = getattr(self.module, 'peft_config', None)
        return sorted(config) if isinstance(config, dict) else []

    def trains_base(self) -> bool:
        return not self.list_adapters()

    def is_export_rank(self) -> bool:
        if self._export_rank is not None:
            return self._export_rank
        import torch.distributed as dist

        return not dist.is_initialized() or dist.get_rank() == 0

    def weight_layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {name: (str(t.dtype).removeprefix('torch.'), tuple(t.shape)) for name, t in self._base().items()}

    def export_base(self, *, bucket_bytes: int = 256 << 20) -> Iterator[Bucket]:
        yield from bucketed(self._gathered(self._base().items()), bucket_bytes)

    def export_adapter(self, name: str, *, bucket_bytes: int = 256 << 20) -> tuple[dict[str, Any], Iterator[Bucket]]:
        adapters = self.list_adapters()
        if name not in adapters:
            raise InvalidInputError(f'The model has no LoRA adapter {name!r}; adapters: {adapters or "none"}.')
        manager = _multi_lora(self.module)
        if manager is not None:
            tensors, config = manager.state_dict(name), manager.record(name).config
        else:
            marker = f'.{name}.'
            tensors = {
                lora_adapter_key(n, name): t
                for n, t in self.module.state_dict(keep_vars=True).items()
                if is_lora_name(n) and marker in n
            }
            peft_model: Any = self.module  # a PeftModel: `peft_config` is a plain attribute, not a submodule
            config = peft_model.peft_config[name]
        return _json_config(config), bucketed(self._gathered(tensors.items()), bucket_bytes)

    def base_storage(self) -> dict[str, int]:
        """Base weight name -> data pointer (tells whether two modules share their base weights)."""
        return {name: t.data_ptr() for name, t in self._base().items()}

    def _base(self) -> dict[str, torch.Tensor]:
        return base_tensors(self.module)

    def _gathered(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        export = self.is_export_rank()
        for name, tensor in pairs:
            tensor = tensor.detach()
            if hasattr(tensor, 'full_tensor'):
                tensor = tensor.full_tensor()  # collective: every rank takes part
            if export:
                yield name, tensor


class WeightExportMethods:
    """`Model` export methods for models that keep their torch module in `self.model`."""

    model: torch.nn.Module

    def _weights(self) -> ModuleWeights:
        return ModuleWeights(self.model)

    def trains_base(self) -> bool:
        return self._weights().trains_base()

    def is_export_rank(self) -> bool:
        return self._weights().is_export_rank()

    def weight_layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return self._weights().weight_layout()

    def export_base(self, *, bucket_bytes: int = 256 << 20) -> Iterator[Bucket]:
        return self._weights().export_base(bucket_bytes=bucket_bytes)

    def export_adapter(self, name: str, *, bucket_bytes: int = 256 << 20) -> tuple[dict[str, Any], Iterator[Bucket]]:
        return self._weights().export_adapter(name, bucket_bytes=bucket_bytes)


def base_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Canonical (plain HF) name -> tensor (no copy) for every non-LoRA entry of the state dict."""
    return {canonical_name(n): t for n, t in module.state_dict(keep_vars=True).items() if not is_lora_name(n)}


def copy_base_weights(module: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy base weights in place (names plain or PEFT-prefixed); returns how many tensors were copied. Every
    name and shape is checked before anything is written."""
    targets = base_tensors(module)
    checked = []
    for name, tensor in named_tensors:
        key = canonical_name(name)
        target = targets.get(key)
        if target is None:
            close = [k for k in targets if k.split('.')[-2:] == key.split('.')[-2:]][:3]
            raise InvalidInputError(
                f'load_weights: no base weight named {name!r} in this model'
                f'{"; similar: " + ", ".join(close) if close else ""}.'
            )
        if target.shape != tensor.shape:
            raise InvalidInputError(
                f'load_weights: {name!r} has shape {tuple(tensor.shape)}, the model expects {tuple(target.shape)}.'
            )
        checked.append((target, tensor))
    with torch.no_grad():
        for target, tensor in checked:
            target.copy_(tensor)
    return len(checked)


def _multi_lora(module: torch.nn.Module) -> Any:
    return find_manager(module)


def _json_config(config: Any) -> dict[str, Any]:
    return to_json(config.to_dict() if hasattr(config, 'to_dict') else dict(vars(config)))
