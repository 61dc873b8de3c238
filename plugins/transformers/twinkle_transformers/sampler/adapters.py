"""LoRA adapters of a sampler's model: which exist, how to add/replace one, and how to run a batch whose rows use
different adapters in ONE forward.

Two backends, chosen by the model (`adapter_backend`):
- `MultiLoraAdapters` -- twinkle's multi-LoRA layers (`twinkle_transformers.multi_lora`): per-row adapter indices,
  grouped per-adapter matmuls, adapters of any rank added and freed at run time. Used for the sampler's own model
  and for models shared with a `MultiLoraTransformersModel`.
- `PeftAdapters` -- a PEFT `PeftModel` (e.g. shared with a LoRA `TransformersModel`): PEFT's mixed-adapter
  inference (``adapter_names=[...]``, ``'__base__'`` for base rows).

Routing is per batch row. Modules whose inputs have no batch-row dimension (a vision tower's image patches) are
reached correctly only when the whole batch runs one adapter: `names_in` tells which adapters have weights in such
a module, `uniform_names` which adapters a whole-batch run reaches there.

Wire format of adapter tensors for both: PEFT's saved-adapter keys (e.g.
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``), i.e. what `adapter_model.safetensors` holds.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_transformers.multi_lora import MultiLoraManager, find_manager
from twinkle_transformers.multi_lora.layer import MultiLoraLinear

Weights = Mapping[str, torch.Tensor]

#: the `adapter_name` that samples a model's base weights where ``None`` means its adapter (a sampler sharing a
#: LoRA model samples the adapter it trains by default; see `default_adapters`)
BASE_WEIGHTS = '__base__'


class AdapterBackend(Protocol):
    def names(self) -> list[str]: ...

    def load(self, name: str, weights: Weights | str | Path, lora_config: Any = None) -> None:
        """Add or replace adapter `name` (PEFT-format tensors or a PEFT directory)."""

    def remove(self, name: str) -> None:
        """Free adapter `name` (known to exist)."""

    def routed(self, rows: list[str | None]) -> tuple[contextlib.AbstractContextManager[Any], dict[str, Any]]:
        """(context, forward kwargs) that run row i with adapter `rows[i]` (None: base weights)."""

    def names_in(self, module: torch.nn.Module) -> set[str]:
        """Adapters with LoRA weights inside `module`."""

    def uniform_names(self) -> set[str]:
        """Adapters that a batch running only that adapter applies to every input of every module."""


def is_peft_model(model: Any) -> bool:
    return hasattr(model, 'peft_config') and hasattr(model, 'base_model')


def adapter_backend(model: torch.nn.Module, *, owned: bool) -> AdapterBackend:
    if is_peft_model(model):
        return PeftAdapters(model)
    if owned or find_manager(model) is not None:
        return MultiLoraAdapters(model)
    return _NoAdapters()


def check_adapters(backend: AdapterBackend, requested: Iterable[str | None]) -> None:
    known = set(backend.names())
    unknown = sorted({n for n in requested if n is not None and n not in known})
    if unknown:
        raise InvalidInputError(
            f'Unknown adapter(s) {unknown}; this sampler has {sorted(known) or "no adapters"}. Load one first with '
            f'`sampler.add_adapter(name, lora_config, tensors)` or `add_adapter(name, path=peft_dir)`.'
        )


def default_adapters(backend: AdapterBackend, requested: list[str | None], *, shared: bool) -> list[str | None]:
    """`requested` with ``None`` resolved and `BASE_WEIGHTS` made ``None`` (the base weights). A sampler sharing a
    model with LoRA adapters (`shared`) samples what the model trains: ``None`` is its adapter when it has exactly
    one, and ambiguous (refused, naming them) when it has several; a sampler with its own weights keeps ``None``
    for the base."""
    names = sorted(backend.names())
    default = None
    if shared and names and any(name is None for name in requested):
        if len(names) > 1:
            raise InvalidInputError(
                f'This sampler shares a model with {len(names)} LoRA adapters {names}; say which one to sample with '
                f'adapter_name= (one of {names}, or {BASE_WEIGHTS!r} for the base weights without any adapter).'
            )
        default = names[0]
    return [default if name is None else None if name == BASE_WEIGHTS else name for name in requested]


class MultiLoraAdapters:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @property
    def manager(self) -> Any:
        return MultiLoraManager.attach(self.model)  # freezes the base on first use; idempotent

    def names(self) -> list[str]:
        manager = find_manager(self.model)
        return manager.adapter_names if manager is not None else []

    def load(self, name: str, weights: Weights | str | Path, lora_config: Any = None) -> None:
        if isinstance(weights, (str, Path)):
            weights, lora_config = read_peft_dir(Path(weights), lora_config)
        config = _as_lora_config(lora_config) if lora_config is not None else None
        manager, weights = self.manager, dict(weights)
        if name not in manager:
            if config is None:
                raise _config_needed(name)
            manager.add_adapter(name, config, state_dict=weights)  # validates before changing anything
            return
        old = manager.record(name).config
        if config is None or _shape_key(config) == _shape_key(old):
            manager.load_state_dict(name, weights)  # validates before copying
            return
        previous = {k: v.clone() for k, v in manager.state_dict(name).items()}
        manager.remove_adapter(name)
        try:
            manager.add_adapter(name, config, state_dict=weights)
        except Exception:
            manager.add_adapter(name, old, state_dict=previous)  # the old adapter survives a bad replacement
            raise

    def remove(self, name: str) -> None:
        self.manager.remove_adapter(name)

    def names_in(self, module: torch.nn.Module) -> set[str]:
        manager = find_manager(self.model)
        if manager is None:
            return set()
        slots = {s for m in module.modules() if isinstance(m, MultiLoraLinear) for s in m._by_slot}
        return {name for name in manager.adapter_names if manager.record(name).slot in slots}

    def uniform_names(self) -> set[str]:
        return set(self.names())  # a uniform batch routes every token (`use_adapter`)

    def routed(self, rows: list[str | None]) -> tuple[contextlib.AbstractContextManager[Any], dict[str, Any]]:
        if all(r is None for r in rows):
            return contextlib.nullcontext(), {}
        manager = self.manager
        if len(set(rows)) == 1:
            return manager.use_adapter(rows[0]), {}
        index = manager.index_tensor(rows, device=next(self.model.parameters()).device)
        return manager.adapter_indices(index), {}


class PeftAdapters:
    BASE = '__base__'

    def __init__(self, model: Any) -> None:
        self.model = model  # a PEFT `PeftModel` (duck-typed by `is_peft_model`)

    def names(self) -> list[str]:
        return sorted(self.model.peft_config)

    def load(self, name: str, weights: Weights | str | Path, lora_config: Any = None) -> None:
        import peft

        if isinstance(weights, (str, Path)):
            weights, lora_config = read_peft_dir(Path(weights), lora_config)
        config = _as_lora_config(lora_config) if lora_config is not None else None
        weights = dict(weights)
        if name in self.model.peft_config and (
            config is None or _shape_key(config) == _shape_key(self.model.peft_config[name])
        ):
            self._check_matches(name, weights)  # before copying anything
            peft.set_peft_model_state_dict(self.model, weights, adapter_name=name)
            return
        if config is None:
            raise _config_needed(name)
        previous = None
        if name in self.model.peft_config:
            previous = (
                self.model.peft_config[name],
                {k: v.clone() for k, v in peft.get_peft_model_state_dict(self.model, adapter_name=name).items()},
            )
            self.model.delete_adapter(name)
        config.inference_mode = True
        self.model.add_adapter(name, config)
        try:
            self._check_matches(name, weights)
        except InvalidInputError:
            self.model.delete_adapter(name)
            if previous is not None:  # the old adapter survives a bad replacement
                self.model.add_adapter(name, previous[0])
                peft.set_peft_model_state_dict(self.model, previous[1], adapter_name=name)
            raise
        peft.set_peft_model_state_dict(self.model, weights, adapter_name=name)

    def remove(self, name: str) -> None:
        self.model.delete_adapter(name)

    def _check_matches(self, name: str, weights: dict[str, torch.Tensor]) -> None:
        import peft

        expected = peft.get_peft_model_state_dict(self.model, adapter_name=name)
        missing = sorted(set(expected) - set(weights))
        unexpected = sorted(set(weights) - set(expected))
        wrong = [k for k in expected if k in weights and tuple(weights[k].shape) != tuple(expected[k].shape)]
        if missing or unexpected or wrong:
            raise InvalidInputError(
                f'Adapter {name!r} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}, '
                f'wrong shape {wrong[:3]} (PEFT keys such as base_model.model.<module>.lora_A.weight expected).'
            )

    def names_in(self, module: torch.nn.Module) -> set[str]:
        return {
            name
            for m in module.modules()
            if isinstance(lora_a := getattr(m, 'lora_A', None), torch.nn.ModuleDict)
            for name in lora_a.keys()
        }

    def uniform_names(self) -> set[str]:
        return {self._active} if self._active is not None else set()

    @property
    def _active(self) -> str | None:
        """The one active adapter (what PEFT's plain forward applies), or None."""
        active = getattr(self.model, 'active_adapters', None)
        active = [active] if isinstance(active, str) else list(active or [])
        return active[0] if len(active) == 1 else None

    def routed(self, rows: list[str | None]) -> tuple[contextlib.AbstractContextManager[Any], dict[str, Any]]:
        if rows and rows[0] is not None and rows[0] == self._active and len(set(rows)) == 1:
            return contextlib.nullcontext(), {}  # PEFT's plain forward: reaches every module's inputs
        return contextlib.nullcontext(), {'adapter_names': [self.BASE if r is None else r for r in rows]}


class _NoAdapters:
    """A shared plain model: adding adapters would inject LoRA layers into the owner's model, so none are."""

    def names(self) -> list[str]:
        return []

    def load(self, name: str, weights: Any, lora_config: Any = None) -> None:
        raise InvalidInputError(
            'This sampler shares a model without LoRA layers with its owner; adding an adapter would inject LoRA '
            "layers into the owner's model. Build the sampler from `model_id=` (its own copy) instead."
        )

    def remove(self, name: str) -> None:
        raise InvalidInputError(f'Unknown adapter {name!r}; this sampler has no adapters.')

    def routed(self, rows: list[str | None]) -> tuple[contextlib.AbstractContextManager[Any], dict[str, Any]]:
        return contextlib.nullcontext(), {}

    def names_in(self, module: torch.nn.Module) -> set[str]:
        return set()

    def uniform_names(self) -> set[str]:
        return set()


def read_peft_dir(path: Path, lora_config: Any) -> tuple[dict[str, torch.Tensor], Any]:
    if not (path / 'adapter_config.json').is_file():
        raise InvalidInputError(f'{path} is not a PEFT adapter directory (no adapter_config.json).')
    from peft.utils import load_peft_weights

    config = lora_config if lora_config is not None else json.loads((path / 'adapter_config.json').read_text())
    return load_peft_weights(str(path), device='cpu'), config


def _config_needed(name: str) -> InvalidInputError:
    return InvalidInputError(
        f'Adapter {name!r} is new: pass `lora_config=` (a peft.LoraConfig or dict with r, lora_alpha, '
        f'target_modules) along with its tensors, or load it from a PEFT directory.'
    )


def _shape_key(config: Any) -> tuple[Any, ...]:
    get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
    targets = get('target_modules')
    targets = tuple(sorted(targets)) if isinstance(targets, (set, list, tuple)) else targets
    return (
        get('r', 8),
        get('lora_alpha', 8),
        targets,
        bool(get('use_rslora', False)),
        json.dumps(get('rank_pattern', {}) or {}, sort_keys=True),
        json.dumps(get('alpha_pattern', {}) or {}, sort_keys=True),
    )


def _as_lora_config(config: Any) -> Any:
    import peft

    if isinstance(config, peft.LoraConfig):
        return config
    if isinstance(config, Mapping):
        fields = {k: v for k, v in config.items() if k in peft.LoraConfig.__dataclass_fields__}
        return peft.LoraConfig(**fields)
    raise InvalidInputError(f'lora_config must be a peft.LoraConfig or a dict, got {type(config).__name__}.')
