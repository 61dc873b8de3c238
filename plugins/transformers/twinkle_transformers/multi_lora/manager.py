"""`MultiLoraManager`: any number of LoRA adapters on one frozen Hugging Face model, routed per row or per token.

    manager = MultiLoraManager.attach(model)           # freezes the base; idempotent
    manager.add_adapter('alice', LoraConfig(r=8, target_modules='all-linear'))
    manager.load_adapter('bob', '/ckpt/bob')           # a PEFT adapter directory
    index = manager.index_tensor(['alice', 'bob', None])   # one adapter per row; None = base model
    with manager.adapter_indices(index):                # or per token: an index of shape [B, T]
        logits = model(input_ids).logits
    manager.remove_adapter('alice')                     # parameters freed; wrapped modules restored

Target Linear modules are wrapped by `MultiLoraLinear` when the first adapter targeting them is added and
restored to the plain `nn.Linear` when the last one is removed, so with no adapters the model is exactly the base.
Slots (the integers in index tensors) are never reused within a manager, so a stale index cannot silently reach a
newer adapter. Outside `adapter_indices` / `use_adapter` the model computes the base model.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from twinkle_core.errors import InvalidInputError
from twinkle_transformers.multi_lora.adapter_config import ModuleLoraShape, resolve_targets, to_lora_config
from twinkle_transformers.multi_lora.layer import LoraWeights, MultiLoraLinear
from twinkle_transformers.multi_lora.peft_format import read_peft_adapter, write_peft_adapter
from twinkle_transformers.multi_lora.routing import BASE_ONLY, AdapterRouter

PEFT_PREFIX = 'base_model.model.'
_ATTR = '_twinkle_multi_lora'


@dataclass
class AdapterRecord:
    """One adapter: its slot in index tensors, its (private) peft LoraConfig and the modules it adapts."""

    name: str
    slot: int
    config: Any
    targets: dict[str, ModuleLoraShape]
    weights: dict[str, LoraWeights]  # module name -> this adapter's weights there
    named_parameters: list[tuple[str, nn.Parameter]] = field(init=False)

    def __post_init__(self) -> None:
        self.named_parameters = [
            (f'{PEFT_PREFIX}{module}.{part}.weight', getattr(w, part).weight)
            for module, w in self.weights.items()
            for part in ('lora_A', 'lora_B')
        ]


class MultiLoraManager:
    """Adds, removes, routes, exports and imports LoRA adapters of one model. Use `attach` to get it."""

    def __init__(self, model: nn.Module, *, freeze_base: bool = True) -> None:
        if getattr(model, _ATTR, None) is not None:
            raise InvalidInputError('this model already has a MultiLoraManager; use MultiLoraManager.attach(model).')
        self.model = model
        self.router = AdapterRouter(validate_slots=self._check_slots)
        self._adapters: dict[str, AdapterRecord] = {}
        self._next_slot = 0
        if freeze_base:
            for param in model.parameters():
                param.requires_grad_(False)
        model.__dict__[_ATTR] = self  # plain attribute: not a submodule, not in state_dict

    @classmethod
    def attach(cls, model: nn.Module, *, freeze_base: bool = True) -> MultiLoraManager:
        """The model's manager, created (and the base frozen) on first use."""
        existing = getattr(model, _ATTR, None)
        return existing if existing is not None else cls(model, freeze_base=freeze_base)

    # ---- adapters ------------------------------------------------------------------------------------------
    @property
    def adapter_names(self) -> list[str]:
        return list(self._adapters)

    def __contains__(self, name: str) -> bool:
        return name in self._adapters

    def record(self, name: str) -> AdapterRecord:
        try:
            return self._adapters[name]
        except KeyError:
            raise KeyError(
                f'no adapter named {name!r}; adapters: {sorted(self._adapters) or "none"}. '
                'Add it first with add_adapter / load_adapter.'
            ) from None

    def add_adapter(
        self,
        name: str,
        config: Any = None,
        *,
        state_dict: dict[str, torch.Tensor] | None = None,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
    ) -> int:
        """Add adapter `name` (a peft LoraConfig or dict); returns its slot.

        Weights are initialised like peft -- with the same global seed, to the very same values -- or taken from
        `state_dict` (peft key format; it must cover every targeted module). `dtype` defaults to the base dtype,
        or float32 when the base is half precision. Nothing is changed when this raises.
        """
        if not isinstance(name, str) or not name:
            raise InvalidInputError(f'adapter name must be a non-empty string, got {name!r}.')
        if name in self._adapters:
            raise InvalidInputError(f'adapter {name!r} already exists; remove it first or pick another name.')
        config = to_lora_config(config)
        targets = resolve_targets(self.model, config)
        weights = {}
        for module, shape in targets.items():  # create + initialise module by module, in peft's order, so the
            w = self._new_weights(module, shape, config, dtype)  # same seed gives peft's exact initial weights
            w.reset_parameters(config.init_lora_weights, generator=generator)
            weights[module] = w.train(self.model.training)  # dropout follows the model's current mode
        if state_dict is not None:
            _copy_peft_state(weights, state_dict, name)
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        for module, w in weights.items():
            self._wrapped(module).add(slot, w)
        self._adapters[name] = AdapterRecord(name, slot, config, targets, weights)
        return slot

    def remove_adapter(self, name: str) -> None:
        """Delete adapter `name`'s parameters; modules left without adapters become plain Linear again."""
        record = self._adapters.pop(name, None)
        if record is None:
            raise KeyError(f'no adapter named {name!r} to remove; adapters: {sorted(self._adapters) or "none"}.')
        for module in record.targets:
            layer = self.model.get_submodule(module)
            assert isinstance(layer, MultiLoraLinear), module  # wrapped when the adapter was added
            layer.remove(record.slot)
            if not len(layer.adapters):
                self._set_submodule(module, layer.base_layer)

    def load_adapter(self, name: str, path: str, *, dtype: torch.dtype | None = None) -> int:
        """Add adapter `name` from a PEFT adapter directory (adapter_config.json + weights); returns its slot."""
        config, state_dict = read_peft_adapter(path)
        return self.add_adapter(name, config, state_dict=state_dict, dtype=dtype)

    def save_adapter(self, name: str, path: str, *, base_model_name_or_path: str | None = None) -> str:
        """Write adapter `name` as a PEFT adapter directory (loads with `peft.PeftModel.from_pretrained`)."""
        record = self.record(name)
        base_id = base_model_name_or_path or getattr(getattr(self.model, 'config', None), '_name_or_path', None)
        return write_peft_adapter(path, record.config, record.targets, self.state_dict(name), base_id)

    def parameters(self, name: str) -> list[nn.Parameter]:
        """Adapter `name`'s trainable parameters (A and B of every targeted module), in a stable order."""
        return [p for _, p in self.named_parameters(name)]

    def named_parameters(self, name: str) -> list[tuple[str, nn.Parameter]]:
        """(peft key, parameter) pairs of adapter `name`, e.g. 'base_model.model.model.layers.0...lora_A.weight'."""
        return list(self.record(name).named_parameters)

    def state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter `name`'s weights in peft's saved format (detached tensors, same device)."""
        return {key: p.detach() for key, p in self.named_parameters(name)}

    @torch.no_grad()
    def load_state_dict(self, name: str, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy peft-format weights into existing adapter `name` (every targeted module must be present)."""
        _copy_peft_state(self.record(name).weights, state_dict, name)

    # ---- routing -------------------------------------------------------------------------------------------
    def slot(self, name: str | None) -> int:
        """The index value of adapter `name` (None -> -1, the base model)."""
        return BASE_ONLY if name is None else self.record(name).slot

    def index_tensor(self, names: Sequence[str | None], device: torch.device | str | None = None) -> torch.Tensor:
        """A per-row index tensor [B] for `adapter_indices` from adapter names (None = base model)."""
        return torch.tensor([self.slot(n) for n in names], dtype=torch.long, device=device)

    @contextlib.contextmanager
    def adapter_indices(self, index: torch.Tensor) -> Iterator[None]:
        """Within the block every forward (and backward) routes token/row i to adapter slot ``index[i]``.

        `index`: [B] (one adapter per row) or [B, T] (per token; packed batches use [1, T]); -1 = base model.
        """
        previous = self.router.state()
        self.router.set_index(index)
        try:
            yield
        finally:
            self.router.restore(previous)

    @contextlib.contextmanager
    def use_adapter(self, name: str | None) -> Iterator[None]:
        """Within the block every token uses adapter `name` (None: the base model)."""
        previous = self.router.state()
        self.router.set_uniform(None if name is None else self.slot(name))
        try:
            yield
        finally:
            self.router.restore(previous)

    # ---- internals -----------------------------------------------------------------------------------------
    def _check_slots(self, slots: list[int]) -> None:
        known = {r.slot for r in self._adapters.values()}
        bad = [s for s in slots if s != BASE_ONLY and s not in known]
        if bad:
            raise InvalidInputError(
                f'adapter index contains unknown slot(s) {bad}; known: '
                f'{ {r.name: r.slot for r in self._adapters.values()} } (-1 = base model).'
            )

    def _new_weights(self, module: str, shape: ModuleLoraShape, config: Any, dtype: torch.dtype | None) -> LoraWeights:
        found = self.model.get_submodule(module)
        base = found.base_layer if isinstance(found, MultiLoraLinear) else found
        assert isinstance(base, nn.Linear), module  # `resolve_targets` only picks Linear modules
        weight = base.weight
        if dtype is None:
            dtype = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
        return LoraWeights(
            base.in_features,
            base.out_features,
            shape.r,
            shape.lora_alpha,
            config.lora_dropout,
            config.use_rslora,
            device=weight.device,
            dtype=dtype,
        )

    def _wrapped(self, module: str) -> MultiLoraLinear:
        layer = self.model.get_submodule(module)
        if not isinstance(layer, MultiLoraLinear):
            assert isinstance(layer, nn.Linear), module  # `resolve_targets` only picks Linear modules
            layer = MultiLoraLinear(layer, self.router).train(layer.training)
            self._set_submodule(module, layer)
        return layer

    def _set_submodule(self, module: str, new: nn.Module) -> None:
        parent_name, _, child = module.rpartition('.')
        parent = self.model.get_submodule(parent_name) if parent_name else self.model
        setattr(parent, child, new)


def _copy_peft_state(weights: dict[str, LoraWeights], state_dict: dict[str, torch.Tensor], name: str) -> None:
    """Copy peft-format tensors into `weights` (module -> LoraWeights). Raises before copying anything on a
    missing key, an unexpected key or a shape mismatch."""
    plan = []
    for module, w in weights.items():
        for part in ('lora_A', 'lora_B'):
            key = _find_key(state_dict, module, part)
            if key is None:
                raise InvalidInputError(
                    f'adapter {name!r}: weights for {module}.{part} are missing from the state '
                    f'dict (expected key {PEFT_PREFIX}{module}.{part}.weight).'
                )
            target = getattr(w, part).weight
            if tuple(state_dict[key].shape) != tuple(target.shape):
                raise InvalidInputError(
                    f'adapter {name!r}: {key} has shape {tuple(state_dict[key].shape)} but the '
                    f'config implies {tuple(target.shape)} (check r / rank_pattern).'
                )
            plan.append((target, state_dict[key], key))
    used = {key for _, _, key in plan}
    extra = sorted(k for k in state_dict if k not in used)
    if extra:
        raise InvalidInputError(
            f'adapter {name!r}: {len(extra)} weight(s) match no targeted module, e.g. {extra[:3]};'
            ' the checkpoint was saved with different target_modules or for another model.'
        )
    with torch.no_grad():
        for target, source, _ in plan:
            target.copy_(source)


def _find_key(state_dict: dict[str, Any], module: str, part: str) -> str | None:
    for key in (f'{PEFT_PREFIX}{module}.{part}.weight', f'{module}.{part}.weight'):
        if key in state_dict:
            return key
    return None


def find_manager(model: nn.Module) -> MultiLoraManager | None:
    """The manager attached to `model`, or None (does not create one; see `MultiLoraManager.attach`)."""
    return getattr(model, _ATTR, None)


def attached_manager(model: nn.Module) -> MultiLoraManager:
    """The manager attached to `model`; raises when there is none."""
    manager = find_manager(model)
    if manager is None:
        raise InvalidInputError('this model has no multi-LoRA adapters; call MultiLoraManager.attach(model) first.')
    return manager


def adapter_indices(model: nn.Module, index: torch.Tensor) -> contextlib.AbstractContextManager[None]:
    """``with adapter_indices(model, index):`` — route rows/tokens of `model`'s forwards to adapter slots."""
    return attached_manager(model).adapter_indices(index)
