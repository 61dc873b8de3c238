"""Apply a twinkle `DeviceMesh` to a Hugging Face model (optionally wrapped by PEFT), in place.

=====================  =========================================================================================
mesh                   what `apply_device_mesh` does
=====================  =========================================================================================
single rank            nothing
dp only                DDP, composable (``replicate``): the module object and its attributes stay as they are
fsdp only              FSDP2 ``fully_shard`` on every decoder layer, then on the root
dp and fsdp            HSDP: FSDP2 on the 2-D (dp, fsdp) mesh (replicate over dp, shard over fsdp)
tp (optionally fsdp)   DTensor ``parallelize_module`` with a Qwen3-style colwise/rowwise plan on every decoder
                       layer (full-parameter models only), then FSDP2 over the fsdp dimension if any
cp (with dp or fsdp)   Ulysses sequence parallelism (`twinkle_transformers.sequence_parallel`) over the cp
                       ranks, which see the same rows; gradients are averaged over every rank: DDP over the
                       world, or FSDP2 sharding over fsdp x cp (HSDP replicating over dp)
ep (with dp)           expert parallelism (`twinkle_transformers.expert_parallel`): each group of ep consecutive
                       data ranks shares the experts of every MoE layer out, tokens travel by all-to-all; DDP
                       over the world for everything else
=====================  =========================================================================================

Contract: call it once, after the weights are loaded and adapters injected (parameters that require grad must be
final) and before the optimizer is built; call the module it was applied to for forward. Saving and loading its
state: `twinkle_transformers.mesh_checkpoint`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from twinkle_core.errors import MeshError
from twinkle_core.mesh import DeviceMesh
from twinkle_core.runtime import distributed
from twinkle_core.train.loss_step import loss_weight
from twinkle_transformers import expert_parallel, sequence_parallel

_APPLIED_ATTR = '_twinkle_device_mesh'

#: what to use instead of the mesh dimensions this backend does not implement (`ModelCapabilities.mesh_advice`;
#: it implements dp, fsdp, tp, cp and ep, as the table above says)
MESH_ADVICE: tuple[tuple[str, str], ...] = (('pp', 'use dp/fsdp/tp, or MegatronModel for pipeline parallelism'),)

# Per-decoder-layer tensor-parallel plan (Qwen3 / Llama / Qwen2 naming). Attention computes its head count from
# the projected width (``view(..., -1, head_dim)``), so colwise-sharded q/k/v give each rank whole heads.
TP_LAYER_PLAN: dict[str, str] = {
    'self_attn.q_proj': 'colwise',
    'self_attn.k_proj': 'colwise',
    'self_attn.v_proj': 'colwise',
    'self_attn.o_proj': 'rowwise',
    'mlp.gate_proj': 'colwise',
    'mlp.up_proj': 'colwise',
    'mlp.down_proj': 'rowwise',
}


def apply_device_mesh(model: nn.Module, mesh: DeviceMesh | None) -> nn.Module:
    """Parallelise `model` in place over `mesh` (see the module docstring) and return it.

    Needs an initialised process group whose size equals ``mesh.world_size`` (``twinkle_core.initialize(mode=
    'local', global_device_mesh=mesh)`` under torchrun; the Ray runtime does it in its workers).
    """
    if mesh is None or mesh.world_size == 1:
        return model
    check_layout(mesh)
    if getattr(model, _APPLIED_ATTR, None) is not None:
        raise MeshError(
            f'a device mesh was already applied to this model ({getattr(model, _APPLIED_ATTR)!r}); '
            'apply_device_mesh must be called once, after adapters are injected.'
        )
    if not distributed.is_initialized():
        raise MeshError(
            f'{mesh!r} needs a torch.distributed process group: call twinkle_core.initialize('
            "mode='local', global_device_mesh=mesh) under torchrun, or use the ray runtime."
        )
    distributed.init_process_group(mesh)  # checks the world size against the mesh
    dp, fsdp, tp, cp = mesh.size('dp'), mesh.size('fsdp'), mesh.size('tp'), mesh.size('cp')
    torch_mesh = mesh.to_torch()
    assert mesh.device_type is not None  # resolved by DeviceMesh.__post_init__
    _move_to_device(model, mesh.device_type)
    if tp > 1 or fsdp > 1:  # sharding keeps each rank's own values: start every rank from rank 0's weights
        _broadcast_from_rank0(model)
    if tp > 1:
        _apply_tensor_parallel(model, torch_mesh['tp'])
    if cp > 1:
        sequence_parallel.enable(model, torch_mesh['cp'].get_group())
    experts: list[nn.Module] = []
    if mesh.ep_size > 1:
        ep_mesh = expert_parallel.expert_mesh(mesh.device_type, data_world_size=dp, ep_size=mesh.ep_size)
        experts = expert_parallel.enable(model, ep_mesh, data_world_size=dp)
    if fsdp > 1:
        _apply_fsdp(model, _fsdp_mesh(torch_mesh, dp=dp, cp=cp))
    elif dp > 1 or cp > 1:
        _apply_ddp(model, ignored=experts)
    setattr(model, _APPLIED_ATTR, mesh)
    return model


def check_layout(mesh: DeviceMesh) -> None:
    """Raise `MeshError` for combinations of dimensions this backend does not compose (see the table above)."""
    dp, tp, cp = mesh.size('dp'), mesh.size('tp'), mesh.size('cp')
    ep = mesh.ep_size
    if ep > 1 and any(mesh.size(dim) > 1 for dim in ('fsdp', 'tp', 'cp', 'pp')):
        raise MeshError(
            f'ep_size={ep} with {mesh!r}: expert parallelism composes with dp only on this backend; use '
            f'DeviceMesh.from_sizes(dp_size=N, ep_size={ep}) with N a multiple of {ep}.'
        )
    if tp > 1 and dp > 1:
        raise MeshError(
            f'dp_size={dp} with tp_size={tp}: shard the data dimension instead '
            f'(DeviceMesh.from_sizes(fsdp_size={dp}, tp_size={tp})), which composes FSDP2 with TP.'
        )
    if tp > 1 and cp > 1:
        raise MeshError(
            f'cp_size={cp} with tp_size={tp}: sequence parallelism composes with dp and fsdp on this backend; '
            'use cp with dp/fsdp, or tp with fsdp.'
        )


def check_model(model: nn.Module, mesh: DeviceMesh | None) -> None:
    """Raise `MeshError` when `model` cannot be split as `mesh` asks (attention heads for cp, experts for ep);
    called at construction, before any process group is needed."""
    if mesh is None:
        return
    if mesh.size('cp') > 1:
        sequence_parallel.check_supported(model, mesh.size('cp'))
    if mesh.ep_size > 1:
        expert_parallel.check_supported(model, mesh.ep_size)


def applied_mesh(model: nn.Module) -> DeviceMesh | None:
    """The mesh `apply_device_mesh` applied to `model`, or None."""
    return getattr(model, _APPLIED_ATTR, None)


def is_sharded(model: nn.Module) -> bool:
    """True when parameters are DTensor shards (FSDP2, TP and/or EP's experts), False for replicas (DDP) or no
    mesh."""
    mesh = applied_mesh(model)
    return mesh is not None and (mesh.size('fsdp') > 1 or mesh.size('tp') > 1 or mesh.ep_size > 1)


# ---- strategies ----------------------------------------------------------------------------------------------
def _move_to_device(model: nn.Module, device_type: str) -> None:
    if device_type == 'cuda':
        model.to(torch.device('cuda', torch.cuda.current_device()))


@torch.no_grad()
def _broadcast_from_rank0(model: nn.Module) -> None:
    import torch.distributed as dist

    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)


def _apply_ddp(model: nn.Module, *, ignored: list[nn.Module]) -> None:
    """DDP over every rank; the `ignored` modules (sharded experts) average their gradients themselves."""
    import warnings

    from torch.distributed._composable.replicate import replicate

    with warnings.catch_warnings():  # composable replicate is flagged experimental; its DDP semantics are stable
        warnings.simplefilter('ignore')
        replicate(model, ignored_modules=ignored or None)


def _apply_fsdp(model: nn.Module, torch_mesh: Any) -> None:
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=torch_mesh)
    fully_shard(model, mesh=torch_mesh)


def _fsdp_mesh(torch_mesh: Any, *, dp: int, cp: int) -> Any:
    """The mesh FSDP2 shards over: fsdp (with cp folded in: sequence-parallel peers average their gradients
    too), 2-D with dp for HSDP."""
    shard_dim = 'fsdp'
    if cp > 1:
        shard_dim = 'fsdp_cp'
        torch_mesh['fsdp', 'cp']._flatten(shard_dim)
    return torch_mesh['dp', shard_dim] if dp > 1 else torch_mesh[shard_dim]


def _apply_tensor_parallel(model: nn.Module, tp_mesh: Any) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    styles = {'colwise': ColwiseParallel, 'rowwise': RowwiseParallel}
    layers = decoder_layers(model)
    if any(hasattr(m, 'lora_A') for m in model.modules()):
        raise MeshError(
            'tensor parallelism with LoRA adapters is not supported by the Transformers backend '
            '(a LoRA branch would see sharded activations); use dp/fsdp for LoRA training.'
        )
    _check_tp_divisible(model, tp_mesh.size())
    for layer in layers:
        missing = [name for name in TP_LAYER_PLAN if not _has_submodule(layer, name)]
        if missing:
            raise MeshError(
                f'{type(layer).__name__} has no {missing}: tensor parallelism supports Qwen3/Llama-style '
                'decoder layers (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj).'
            )
        parallelize_module(layer, tp_mesh, {name: styles[kind]() for name, kind in TP_LAYER_PLAN.items()})


def _has_submodule(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def _check_tp_divisible(model: nn.Module, tp: int) -> None:
    config = getattr(model, 'config', None)
    if config is None:
        return
    for field in ('num_attention_heads', 'num_key_value_heads', 'intermediate_size'):
        value = getattr(config, field, None)
        if value is not None and value % tp:
            raise MeshError(f'tp_size={tp} does not divide {field}={value}; pick a tp_size that divides it.')


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of `model` (classes named in HF's ``_no_split_modules``; PEFT wrappers see through)."""
    block_names: set[str] = set()
    for module in model.modules():
        block_names.update(getattr(module, '_no_split_modules', None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in block_names]
    if not layers:
        raise MeshError(
            f'could not find the decoder layers of {type(model).__name__} (no `_no_split_modules`); '
            'FSDP/TP need a Hugging Face transformer model.'
        )
    return layers


# ---- losses and metrics across data ranks --------------------------------------------------------------------
def _replication(mesh: DeviceMesh) -> int:
    """How many ranks hold each data shard (tensor-parallel peers see the same rows)."""
    return mesh.world_size // mesh.data_world_size


def backward_scale(model: nn.Module, reduction: str | None, *, num_loss_tokens: int, num_rows: int) -> float:
    """Factor on this rank's loss so that the gradients averaged by DDP/FSDP equal the single-process gradients
    of the whole global batch. 1.0 without a mesh. Collective under a mesh (every rank calls it)."""
    mesh = applied_mesh(model)
    if mesh is None:
        return 1.0
    if reduction == 'sum':  # gradients add up over the batch; DDP/FSDP average over the data ranks
        return float(mesh.data_world_size)
    weight = loss_weight(reduction, num_loss_tokens=num_loss_tokens, num_rows=num_rows)
    return distributed.data_parallel_loss_scale(weight)  # tp peers count twice in both sums: the ratio holds


def reduce_step_summary(
    model: nn.Module, summary: dict[str, Any], reduction: str | None, *, num_rows: int
) -> dict[str, Any]:
    """Turn one rank's micro-batch summary (``loss``, ``num_loss_tokens``, ``num_correct``, ``num_tokens``) into
    the global batch's: the loss as the single process would report it, counts summed over data shards.
    Returns `summary` unchanged without a mesh. Collective under a mesh."""
    mesh = applied_mesh(model)
    if mesh is None:
        return summary
    weight = loss_weight(reduction, num_loss_tokens=summary['num_loss_tokens'], num_rows=num_rows)
    counts = ('num_loss_tokens', 'num_correct', 'num_tokens')
    sums = distributed.all_reduce_sum([summary['loss'] * weight, weight, *(float(summary[k]) for k in counts)])
    copies = _replication(mesh)
    loss = sums[0] / copies if reduction == 'sum' else (sums[0] / sums[1] if sums[1] else 0.0)
    return {**summary, 'loss': loss, **{k: int(round(v / copies)) for k, v in zip(counts, sums[2:])}}
