"""Expert parallelism for Hugging Face mixture-of-experts models (the Qwen3-MoE layout): the mesh's ``ep_size``.

Layout. ``ep_size`` consecutive data ranks form an expert group; each holds ``num_experts / ep_size`` experts of
every MoE layer. The expert weights (``experts.gate_up_proj [E, 2I, H]``, ``experts.down_proj [E, H, I]``) become
DTensors sharded along the expert dimension over the ``ep`` dimension of an ``(expert_dp, ep)`` torch mesh and
replicated over ``expert_dp`` (the ranks holding the same experts), so saving, loading, sharded checkpoints and
export see whole tensors. Routers, attention and everything else stay replicated (DDP).

Forward of one MoE layer, on each rank for its own tokens (`expert_parallel_experts`, registered with transformers
as the experts implementation ``twinkle_expert_parallel``): the (replicated) router picks ``top_k`` experts per
token; every (token, expert) pair is sent to the rank holding that expert by an all-to-all with uneven splits (the
counts are exchanged first); the receiver runs each of its experts on the rows it got; a second all-to-all returns
the outputs, which the sender weights by the router and sums per token. The backward is the same exchange in
reverse, so a rank's experts receive the gradients of every token routed to them from the whole expert group.

Gradients. DDP averages the dense gradients over the data ranks. An expert's gradient is summed over the expert
group by the exchange, then over ``expert_dp`` (an all-reduce in the backward) and divided by the data world size:
the same average, so training equals one process. Frozen experts (LoRA) need none of it.

LoRA. peft adapts 3-D expert weights through ``ParamWrapper`` modules (``target_parameters``; ``'all-linear'`` on
MoE models does it too), which would add the whole stack's low-rank update to each rank's slice. Their forward is
made a pass-through, and each rank adds the update of its own experts (``W_e + scaling * B_e @ A_e``, the factors'
rows of those experts) when it runs them. The factors stay replicated under DDP: a rank's factor gradients cover
its experts only, and DDP's sum over the ranks divided by their number is the single-process gradient.

Contract: the model's expert modules use HF's 3-D layout (``@use_experts_implementation``, gate and up
concatenated, no bias, not transposed); ``num_experts`` is divisible by ``ep_size``; every rank of the expert
group runs every forward (the exchange is collective).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from twinkle_core.errors import MeshError
from twinkle_core.loss.chunking import unwrap_causal_lm

EXPERTS_IMPLEMENTATION = 'twinkle_expert_parallel'
EXPERT_WEIGHTS = ('gate_up_proj', 'down_proj')
_SHARD_ATTR = '_twinkle_expert_shard'
_LORA_ATTR = '_twinkle_expert_lora'  # {weight name: the peft ParamWrapper adapting it}
_registered = False


@dataclass(frozen=True)
class ExpertShard:
    """What one rank's expert module needs to exchange tokens: its expert group and expert-dp group."""

    group: Any  # the ep ranks exchanging tokens
    size: int  # ep_size
    rank: int  # this rank's index in `group`: it holds experts [rank * local_experts, (rank + 1) * local_experts)
    local_experts: int
    replica_group: Any  # the expert_dp ranks holding the same experts (None: one)
    data_world_size: int  # what the expert gradients are divided by (DDP's average)


def expert_modules(model: nn.Module) -> list[Any]:
    """The expert modules of `model`: HF 3-D expert layouts (``gate_up_proj``/``down_proj`` parameters with an
    expert dimension, ``num_experts``); empty for dense models."""

    def holds_experts(module: nn.Module) -> bool:  # its own parameters (not a wrapper's view of them)
        params = [module._parameters.get(name) for name in EXPERT_WEIGHTS]
        return hasattr(module, 'num_experts') and all(p is not None and p.dim() == 3 for p in params)

    return [m for m in model.modules() if holds_experts(m)]


def check_supported(model: nn.Module, ep_size: int) -> list[Any]:
    """The expert modules `model` shards over `ep_size` ranks; `MeshError` when it has none or cannot."""
    modules = expert_modules(model)
    if not modules:
        raise MeshError(
            f'ep_size={ep_size}: {type(unwrap_causal_lm(model)).__name__} has no mixture-of-experts layers '
            '(expert parallelism shards experts); use ep_size=1 for dense models.'
        )
    for module in modules:
        layout = {k: getattr(module, k, None) for k in ('has_gate', 'has_bias', 'is_transposed', 'is_concatenated')}
        if layout != {'has_gate': True, 'has_bias': False, 'is_transposed': False, 'is_concatenated': True}:
            raise MeshError(
                f'{type(module).__name__} stores its experts as {layout}; expert parallelism on the Transformers '
                'backend supports the Qwen3-MoE layout (gate and up concatenated, no bias, not transposed).'
            )
        if module.num_experts % ep_size:
            raise MeshError(
                f'ep_size={ep_size} does not divide num_experts={module.num_experts}; pick an ep_size that '
                'divides it (each rank holds num_experts / ep_size experts).'
            )
    return modules


def enable(model: nn.Module, torch_mesh: Any, *, data_world_size: int) -> list[Any]:
    """Shard the experts of `model` over the ``ep`` dimension of `torch_mesh` (dims ``('expert_dp', 'ep')``),
    route its expert modules through `expert_parallel_experts`; returns the expert modules (for DDP to ignore)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    ep_mesh = torch_mesh['ep']
    modules = check_supported(model, ep_mesh.size())
    replicas = torch_mesh['expert_dp'].size()
    shard = ExpertShard(
        group=ep_mesh.get_group(),
        size=ep_mesh.size(),
        rank=ep_mesh.get_local_rank(),
        local_experts=modules[0].num_experts // ep_mesh.size(),
        replica_group=torch_mesh['expert_dp'].get_group() if replicas > 1 else None,
        data_world_size=data_world_size,
    )
    for module in modules:
        for name in EXPERT_WEIGHTS:
            param = getattr(module, name)
            sharded = distribute_tensor(param.detach(), torch_mesh, [Replicate(), Shard(0)])
            setattr(module, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        setattr(module, _SHARD_ATTR, shard)
        setattr(module, _LORA_ATTR, {})
    _adopt_lora_wrappers(model, modules)
    _register()
    config: Any = unwrap_causal_lm(model).config
    config.get_text_config()._experts_implementation = EXPERTS_IMPLEMENTATION
    return modules


def expert_mesh(device_type: str, *, data_world_size: int, ep_size: int) -> Any:
    """The ``(expert_dp, ep)`` torch mesh: ep groups are consecutive data ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (data_world_size // ep_size, ep_size), mesh_dim_names=('expert_dp', 'ep'))


def _adopt_lora_wrappers(model: nn.Module, modules: list[Any]) -> None:
    """Hand the LoRA factors of peft's ``ParamWrapper``s around expert weights to the expert modules (see the
    module docstring) and make the wrappers pass their input straight through."""
    experts = {id(m) for m in modules}
    wrappers: list[Any] = [m for m in model.modules() if type(m).__name__ == 'ParamWrapper']
    for wrapper in wrappers:
        if id(wrapper.get_base_layer()) in experts:
            getattr(wrapper.get_base_layer(), _LORA_ATTR)[wrapper.parameter_name] = wrapper
            wrapper.forward = wrapper.base_layer.__call__


def _register() -> None:
    global _registered
    if not _registered:
        from transformers.integrations.moe import ExpertsInterface

        ExpertsInterface.register(EXPERTS_IMPLEMENTATION, expert_parallel_experts)
        _registered = True


# ---- the forward -----------------------------------------------------------------------------------------------
def expert_parallel_experts(
    module: nn.Module, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor
) -> Tensor:
    """The experts' output ``[T, H]`` for this rank's tokens ``hidden_states [T, H]`` routed to ``top_k_index
    [T, k]`` (global expert ids) with weights ``top_k_weights [T, k]``; collective over the expert group."""
    shard: ExpertShard | None = getattr(module, _SHARD_ATTR, None)
    if shard is None:
        raise MeshError(f'{type(module).__name__} was not sharded by twinkle_transformers.expert_parallel.enable')
    top_k = top_k_index.shape[1]
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)  # the (token, choice) pairs grouped by expert, so by owning rank
    token_of = order // top_k
    sent_per_expert = torch.bincount(flat, minlength=shard.size * shard.local_experts)
    received_per_expert = torch.empty_like(sent_per_expert)  # [source rank, local expert], flattened
    dist.all_to_all_single(received_per_expert, sent_per_expert, group=shard.group)
    send_splits = sent_per_expert.view(shard.size, -1).sum(1).tolist()
    recv_splits = received_per_expert.view(shard.size, -1).sum(1).tolist()

    received = _AllToAll.apply(hidden_states[token_of], recv_splits, send_splits, shard.group)
    outputs = _run_local_experts(module, shard, received, received_per_expert)
    returned = _AllToAll.apply(outputs, send_splits, recv_splits, shard.group)

    weighted = returned * top_k_weights.reshape(-1)[order].unsqueeze(-1)
    final = torch.zeros_like(hidden_states)
    return final.index_add(0, token_of, weighted.to(final.dtype))


def _run_local_experts(module: Any, shard: ExpertShard, rows: Tensor, received_per_expert: Tensor) -> Tensor:
    """Each local expert's output on the rows it received (rows arrive grouped by source rank, then expert)."""
    gate_up, down = (_local_weight(module, name, shard) for name in EXPERT_WEIGHTS)
    counts = received_per_expert.view(shard.size, shard.local_experts)
    local_ids = torch.arange(shard.local_experts, device=rows.device).repeat(shard.size)
    expert_of_row = torch.repeat_interleave(local_ids, counts.reshape(-1))
    by_expert = torch.argsort(expert_of_row, stable=True)
    per_expert = counts.sum(0).tolist()
    parts = []
    for expert, chunk in enumerate(torch.split(rows[by_expert], per_expert)):
        if chunk.shape[0]:
            hidden = module._apply_gate(nn.functional.linear(chunk, gate_up[expert]))
            parts.append(nn.functional.linear(hidden, down[expert]))
    # no row for any local expert: [0, H] still made from `rows`, so that the exchange that delivered them is on
    # this rank's backward graph (its backward is collective: every rank of the group must run it)
    outputs = torch.cat(parts) if parts else rows * 0.0
    if gate_up.requires_grad:  # where no token came, the weights (their gradient sync; DDP's LoRA factors) must
        outputs = outputs + 0.0 * (gate_up.sum() + down.sum())  # still get a (zero) gradient on this rank
    return torch.empty_like(outputs).index_copy(0, by_expert, outputs)


def _local_weight(module: Any, name: str, shard: ExpertShard) -> Tensor:
    """This rank's experts' weight `name` ``[local_experts, out, in]``, plus the active LoRA adapters' updates."""
    param = getattr(module, name)
    weight = param.to_local() if hasattr(param, 'to_local') else param
    if weight.requires_grad:
        weight = _ExpertGradient.apply(weight, shard.replica_group, shard.data_world_size)
    wrapper = getattr(module, _LORA_ATTR).get(name)
    if wrapper is None or wrapper.disable_adapters:
        return weight
    if wrapper.merged:
        raise MeshError('LoRA adapters merged into sharded expert weights are not supported; unmerge them first.')
    experts = slice(shard.rank * shard.local_experts, (shard.rank + 1) * shard.local_experts)
    for adapter in wrapper.active_adapters:
        if adapter in wrapper.lora_A:
            lhs, rhs, scaling = wrapper.get_delta_factors(adapter)  # [E, out, r], [E, r, in]
            weight = torch.baddbmm(weight, lhs[experts], rhs[experts], alpha=scaling)
    return weight


class _AllToAll(torch.autograd.Function):
    """Rows of `x` split by `send_splits` to the group's ranks; the backward sends the gradients back."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, recv_splits: list[int], send_splits: list[int], group: Any) -> Tensor:
        ctx.splits, ctx.group = (recv_splits, send_splits), group
        out = x.new_empty(sum(recv_splits), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        recv_splits, send_splits = ctx.splits
        out = grad.new_empty(sum(send_splits), *grad.shape[1:])
        dist.all_to_all_single(out, grad.contiguous(), send_splits, recv_splits, group=ctx.group)
        return out, None, None, None


class _ExpertGradient(torch.autograd.Function):
    """Identity on an expert weight; its backward sums the gradient over the ranks holding the same experts and
    divides by the data world size (the average DDP gives the dense parameters)."""

    @staticmethod
    def forward(ctx: Any, weight: Tensor, replica_group: Any, data_world_size: int) -> Tensor:
        ctx.replica_group, ctx.data_world_size = replica_group, data_world_size
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        grad = grad.contiguous().clone()
        if ctx.replica_group is not None:
            dist.all_reduce(grad, group=ctx.replica_group)
        return grad.div_(ctx.data_world_size), None, None
