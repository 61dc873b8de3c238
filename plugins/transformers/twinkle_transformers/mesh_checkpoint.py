"""Model and optimizer state of a model that `twinkle_transformers.parallel.apply_device_mesh` parallelised.

Saving: gather with `full_state_dict` / `full_optimizer_state_dict` (collective; rank 0 gets CPU tensors) and
write on rank 0 (`gather_for_save`). Loading: every rank passes the same full state to `load_full_state_dict` /
`load_optimizer_state`, which reshard it to whatever mesh this run has. Without a mesh these are plain
``state_dict`` operations. (Sharded checkpoints, where each rank writes its own shards, are
`twinkle_transformers.sharded_checkpoint`.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from twinkle_core.errors import InvalidInputError, MeshError
from twinkle_core.runtime import distributed
from twinkle_transformers.parallel import applied_mesh, is_sharded


# ---- model state ----------------------------------------------------------------------------------------------
def full_state_dict(model: nn.Module, *, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """Unsharded CPU state dict of `model`. Collective under a mesh: every rank must call it; rank 0 gets the
    tensors, other ranks get an empty dict. `trainable_only` keeps only parameters that require grad."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if applied_mesh(model) is None:
        sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    else:
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not distributed.is_main_process():
            return {}
    if trainable_only:
        keep = {name for name, p in model.named_parameters() if p.requires_grad}
        sd = {k: v for k, v in sd.items() if k in keep}
    return sd


def load_full_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], *, strict: bool = False) -> None:
    """Load an unsharded state dict (e.g. read from a checkpoint written by any world size) into `model`.

    Under a mesh every rank must call it with the same tensors; they are resharded to this run's layout.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if applied_mesh(model) is None:
        result = model.load_state_dict(state_dict, strict=strict)
    else:
        # torch types this read-only input as the invariant dict[str, ValueType]; a dict of tensors is what it takes
        options = StateDictOptions(full_state_dict=True, strict=strict)
        result = set_model_state_dict(model, state_dict, options=options)  # type: ignore[arg-type]
    unexpected = getattr(result, 'unexpected_keys', [])
    if unexpected:
        raise KeyError(
            f'{len(unexpected)} checkpoint tensors match no parameter of the model, e.g. '
            f'{unexpected[:3]}; was it saved from a different model or adapter?'
        )


# ---- saving, optimizer state ----------------------------------------------------------------------------------
def gather_for_save(model: nn.Module) -> tuple[bool, dict[str, torch.Tensor] | None]:
    """``(write_here, state_dict)`` for saving `model`: only rank 0 writes under a mesh; `state_dict` is the
    gathered full state dict for sharded models (collective), None where the live module can be saved as is."""
    mesh = applied_mesh(model)
    if mesh is None:
        return True, None
    if is_sharded(model):
        state = full_state_dict(model)
        return distributed.is_main_process(), state
    return distributed.is_main_process(), None


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Unsharded CPU optimizer state keyed by parameter name (FQN) -- the checkpoint format for every world size
    and strategy (``{'state': {fqn: {...}}, 'param_groups': [{'params': [fqn, ...], ...}]}``).

    Collective under a mesh (every rank must call it): rank 0 gets the state, other ranks an empty dict.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    meshed = applied_mesh(model) is not None
    reshard(model)
    if not optimizer.state:  # before the first step: DCP would initialise the state with a zero-lr step (mutating
        # this run's optimizer); only the hyper-parameters exist, and every rank holds them whole
        return {} if meshed and not distributed.is_main_process() else _groups_by_name(model, optimizer)
    # Without a mesh nothing is gathered; cpu_offload would keep the state on rank 0 of any process group.
    state = get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=meshed)
    )
    if meshed and not distributed.is_main_process():
        return {}
    return state if meshed else _to_cpu(state)


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load optimizer state saved by any world size into `optimizer` (built over `model`'s parameters after the
    mesh was applied), resharded to this run's layout (rank 0's copy is broadcast). Name-keyed state comes from
    `full_optimizer_state_dict`; index-keyed state (``optimizer.state_dict()``: `MultiLoraTransformersModel`,
    older checkpoints) is matched by position, as ``optimizer.load_state_dict`` does. Collective under a mesh."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    reshard(model)
    if not _keyed_by_name(state):
        state = _keyed_by_position(model, optimizer, state)
    if not state.get('state'):  # saved before the first step: hyper-parameters only
        optimizer.load_state_dict(_groups_by_index(model, optimizer, state))
        return
    set_optimizer_state_dict(
        model,
        optimizer,
        optim_state_dict=state,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=applied_mesh(model) is not None),
    )


def reshard(model: nn.Module) -> None:
    """Register the sharded parameters again on FSDP2 modules that hold them unsharded (the root stays unsharded
    after a forward without backward, e.g. `forward_only`), so the optimizer's parameters are the module's."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _optimizer_parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group['params']]


def _groups_by_name(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    names = _optimizer_parameter_names(model, optimizer)
    groups = optimizer.state_dict()['param_groups']
    return {'state': {}, 'param_groups': [{**g, 'params': [names[i] for i in g['params']]} for g in groups]}


def _groups_by_index(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    index = {name: i for i, name in enumerate(_optimizer_parameter_names(model, optimizer))}
    unknown = [n for g in state['param_groups'] for n in g['params'] if n not in index]
    if unknown:
        raise InvalidInputError(
            f'{len(unknown)} parameters of the saved optimizer state are not optimised here, e.g. '
            f'{unknown[:3]}; was it saved from another model or adapter?'
        )
    return {
        'state': {},
        'param_groups': [{**g, 'params': [index[n] for n in g['params']]} for g in state['param_groups']],
    }


def _keyed_by_position(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
    names = _optimizer_parameter_names(model, optimizer)
    saved = [p for g in state['param_groups'] for p in g['params']]
    if len(saved) != len(names):
        raise InvalidInputError(
            f'the saved optimizer state covers {len(saved)} parameters, this optimizer '
            f'{len(names)}; was it saved from another model or adapter?'
        )
    name_of = dict(zip(saved, names))
    return {
        'state': {name_of[k]: v for k, v in state['state'].items()},
        'param_groups': [{**g, 'params': [name_of[p] for p in g['params']]} for g in state['param_groups']],
    }


def _keyed_by_name(state: dict[str, Any]) -> bool:
    params = [p for group in state.get('param_groups', []) for p in group.get('params', [])]
    return any(isinstance(key, str) for key in [*state.get('state', {}), *params])


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value


def load_adapter_weights_sharded(model: nn.Module, adapter_name: str, weights: dict[str, torch.Tensor]) -> None:
    """Load PEFT-format adapter weights (keys without the adapter name) into a sharded PEFT model."""
    suffix = f'.{adapter_name}'
    by_saved_key = {}
    for key in model.state_dict():
        if suffix in key:
            by_saved_key[key.replace(suffix + '.', '.', 1)] = key
    unknown = [k for k in weights if k not in by_saved_key]
    if unknown:
        raise MeshError(
            f'{len(unknown)} adapter tensors match no parameter of adapter {adapter_name!r}, e.g. '
            f'{unknown[:3]}; was the checkpoint saved with another LoRA config or base model?'
        )
    load_full_state_dict(model, {by_saved_key[k]: v for k, v in weights.items()})
