"""Full tensors out of a split Megatron model, in Hugging Face / PEFT naming, streamed to global rank 0.

Every rank iterates the same sequence of tensors (the union over pipeline stages, in model order). For each
one, the data-parallel replica 0 of the pipeline stage that owns it gathers the tensor-parallel shards, its
tp-rank 0 sends the full tensor to global rank 0 (a shape header, then the data), and rank 0 yields it under
its Hugging Face / PEFT name. One tensor is in flight at a time; other ranks yield nothing. Collective: every
rank of the model must iterate to the end.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from twinkle_megatron import build, convert, groups, lora
from twinkle_megatron.architecture import Architecture

Join = Callable[[list[Tensor]], Tensor]
_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _cat(dim: int | None) -> Join:
    return (lambda shards: shards[0]) if dim is None else (lambda shards: torch.cat(shards, dim=dim))


def _order(name: str) -> tuple[int, int, str]:
    """Model order: embedding, layers by index, then the final norm and the output layer."""
    if name.startswith('embedding.'):
        return (0, 0, name)
    if name.startswith('decoder.layers.'):
        return (1, int(name.split('.')[2]), name)
    return (2, 0, name)


def stream_full(local: dict[str, tuple[Tensor, Join]]) -> Iterator[tuple[str, Tensor]]:
    """(name, full tensor) for every name of `local` on any pipeline stage, on global rank 0 (see module doc).
    `local`: this rank's name -> (its shard, how tp shards join into the full tensor)."""
    from megatron.core import parallel_state as ps
    names: list[list[str]] = [[] for _ in range(ps.get_pipeline_model_parallel_world_size())]
    dist.all_gather_object(names, sorted(local), group=groups.pp_group())
    owners = {n: stage for stage, stage_names in enumerate(names) for n in stage_names}
    me = groups.ranks()
    rank = dist.get_rank()
    for name in sorted(owners, key=_order):
        owner = owners[name]
        sender = _stage_rank0(owner)
        full = None
        if me['pp'] == owner and me['dp'] == 0:
            shard, join = local[name]
            shard = shard.detach()
            tp = ps.get_tensor_model_parallel_world_size()
            if tp > 1:
                shards = [torch.empty_like(shard) for _ in range(tp)]
                dist.all_gather(shards, shard.contiguous(), group=groups.tp_group())
                full = join(shards)
            else:
                full = join([shard])
        if sender == 0:
            if rank == 0:
                yield name, full.clone()
            continue
        if rank == sender:
            header = torch.tensor([_DTYPES.index(full.dtype), full.dim(), *full.shape] + [0] * (8 - full.dim()),
                                  dtype=torch.long, device=full.device)
            dist.send(header, dst=0)
            dist.send(full.contiguous(), dst=0)
        elif rank == 0:
            header = torch.empty(10, dtype=torch.long, device=_device())
            dist.recv(header, src=sender)
            shape = header[2:2 + int(header[1])].tolist()
            tensor = torch.empty(shape, dtype=_DTYPES[int(header[0])], device=_device())
            dist.recv(tensor, src=sender)
            yield name, tensor


def _device() -> torch.device:
    """Where point-to-point buffers live: the current GPU under NCCL, else the CPU."""
    return torch.device('cuda', torch.cuda.current_device()) if dist.get_backend() == 'nccl' else torch.device('cpu')


def _stage_rank0(stage: int) -> int:
    """Global rank of (pp=stage, dp=0, tp=0): the mesh orders ranks pp, dp, tp (tp innermost)."""
    from megatron.core import parallel_state as ps
    return stage * ps.get_data_parallel_world_size() * ps.get_tensor_model_parallel_world_size()


def base_items(chunks: list) -> dict[str, tuple[Tensor, Join]]:
    """This rank's base weights by global Megatron name, with their tp join."""
    items = {}
    for chunk in chunks:
        for name, tensor in build.base_parameters(chunk).items():
            items[name] = (tensor, lambda shards, n=name: convert.gather_layout(n, shards))
    return items


def hf_base_weights(chunks: list, arch: Architecture) -> Iterator[tuple[str, Tensor]]:
    """Every base weight as (HF name, full tensor) on rank 0 (tied output layer and vocab padding dropped)."""
    items = {n: v for n, v in base_items(chunks).items()
             if not (n == 'output_layer.weight' and arch.tied_embeddings)}
    for name, full in stream_full(items):
        yield from convert.to_hf(arch, name, full)


def lora_items(chunks: list) -> dict[str, tuple[Tensor, Join]]:
    """This rank's LoRA factors by PEFT key, with their tp join."""
    items = {}
    for name, module in lora.lora_modules(chunks).items():
        layer = int(name.split('.')[2])
        for part in module.parts:
            a_dim, b_dim = (1, None) if module.kind == 'row' else (None, 0)
            items[lora.peft_key(layer, part, 'A')] = (module.lora_A[part], _cat(a_dim))
            items[lora.peft_key(layer, part, 'B')] = (module.lora_B[part], _cat(b_dim))
    return items


def peft_weights(chunks: list) -> Iterator[tuple[str, Tensor]]:
    """The adapter as (PEFT key, full tensor) on rank 0."""
    yield from stream_full(lora_items(chunks))
