"""Full tensors out of a split Megatron model, in Hugging Face / PEFT naming, streamed to global rank 0.

Every rank iterates the same sequence of tensors (the union over pipeline stages, in model order). For each
one, the data-parallel replica 0 of the pipeline stage that owns it gathers the tensor-parallel shards, its
tp-rank 0 sends the full tensor to global rank 0 (a shape header, then the data), and rank 0 yields it under
its Hugging Face / PEFT name. One tensor is in flight at a time; other ranks yield nothing. Collective: every
rank of the model must iterate to the end. Expert weights are sent by expert-data-parallel replica 0 of each
expert-parallel rank, under their global expert index.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from twinkle_megatron import build, convert, groups, lora, value_head
from twinkle_megatron.architecture import Architecture

Join = Callable[[list[Tensor]], Tensor]
_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _cat(dim: int | None) -> Join:
    return (lambda shards: shards[0]) if dim is None else (lambda shards: torch.cat(shards, dim=dim))


def _vocab_cat(vocab_size: int) -> Join:
    """Join vocab-parallel output shards and drop Megatron's vocab padding."""
    return lambda shards: torch.cat(shards)[:vocab_size]


def _layout_join(name: str) -> Join:
    """Join the tp shards of base weight `name` as Megatron lays it out (`convert.gather_layout`)."""
    return lambda shards: convert.gather_layout(name, shards)


def _order(name: str) -> tuple[int, int, str]:
    """Model order: embedding, layers by index, then the final norm and the output layer."""
    if name.startswith('embedding.'):
        return (0, 0, name)
    if name.startswith('decoder.layers.'):
        return (1, int(name.split('.')[2]), name)
    return (2, 0, name)


def is_expert(name: str) -> bool:
    return '.experts.local_experts.' in name


def _sends(name: str) -> bool:
    """This rank's tp group gathers and sends `name`: data-parallel replica 0 of its pipeline stage (for expert
    weights: expert-data-parallel replica 0 of its expert-parallel rank)."""
    from megatron.core import parallel_state as ps

    if is_expert(name):
        return ps.get_expert_data_parallel_rank() == 0
    return ps.get_data_parallel_rank() == 0


def stream_full(local: dict[str, tuple[Tensor, Join]]) -> Iterator[tuple[str, Tensor]]:
    """(name, full tensor) for every name of `local` on any rank, on global rank 0 (see the module docstring).
    `local`: this rank's name -> (its shard, how tp shards join into the full tensor); names are global (layer
    and expert indices of the whole model)."""
    from megatron.core import parallel_state as ps

    rank = dist.get_rank()
    mine = sorted(n for n in local if _sends(n))
    published: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(published, mine if ps.get_tensor_model_parallel_rank() == 0 else [])
    owners = {n: r for r, names in enumerate(published) for n in names}  # name -> the tp-rank-0 sender
    mine_set = set(mine)
    for name in sorted(owners, key=_order):
        sender, full = owners[name], None
        if name in mine_set:  # always on the sender: it published `name` from its own `mine`
            shard, join = local[name]
            group = ps.get_expert_tensor_parallel_group() if is_expert(name) else groups.tp_group()
            size = dist.get_world_size(group)
            shards = [shard.detach().contiguous()]
            if size > 1:
                shards = [torch.empty_like(shards[0]) for _ in range(size)]
                dist.all_gather(shards, shard.detach().contiguous(), group=group)
            full = join(shards)
        if rank == sender:
            assert full is not None
            if sender == 0:
                yield name, full.clone()
                continue
            header = torch.tensor(
                [_DTYPES.index(full.dtype), full.dim(), *full.shape] + [0] * (8 - full.dim()),
                dtype=torch.long,
                device=full.device,
            )
            dist.send(header, dst=0)
            dist.send(full.contiguous(), dst=0)
        elif rank == 0:
            header = torch.empty(10, dtype=torch.long, device=_device())
            dist.recv(header, src=sender)
            shape = header[2 : 2 + int(header[1])].tolist()
            tensor = torch.empty(shape, dtype=_DTYPES[int(header[0])], device=_device())
            dist.recv(tensor, src=sender)
            yield name, tensor


def _device() -> torch.device:
    """Where point-to-point buffers live: the current GPU under NCCL, else the CPU."""
    return torch.device('cuda', torch.cuda.current_device()) if dist.get_backend() == 'nccl' else torch.device('cpu')


def base_items(chunks: list, expert_offset: int = 0) -> dict[str, tuple[Tensor, Join]]:
    """This rank's base weights by global Megatron name, with their tp join."""
    items: dict[str, tuple[Tensor, Join]] = {}
    for chunk in chunks:
        for name, tensor in build.base_parameters(chunk, expert_offset).items():
            items[name] = (tensor, _layout_join(name))
    return items


def hf_base_weights(chunks: list, arch: Architecture, expert_offset: int = 0) -> Iterator[tuple[str, Tensor]]:
    """Every base weight as (HF name, full tensor) on rank 0, vocabulary padding dropped; a tied output layer is
    ``lm_head.weight``, the embedding tensor itself (as in the HF module's state dict). `expert_offset`: this
    rank's first expert (expert parallelism)."""
    items = {
        n: v
        for n, v in base_items(chunks, expert_offset).items()
        if not (n == 'output_layer.weight' and arch.tied_embeddings)
    }
    for name, full in stream_full(items):
        for hf_name, tensor in convert.to_hf(arch, name, full):
            yield hf_name, tensor
            if hf_name == 'model.embed_tokens.weight' and arch.tied_embeddings:
                yield 'lm_head.weight', tensor


def lora_items(chunks: list, arch: Architecture, adapter: str) -> dict[str, tuple[Tensor, Join]]:
    """This rank's factors of adapter `adapter` by PEFT key, with their tp join (the output layer's B without
    vocab padding), and the weights trained in full beside it (a value model's head)."""
    items = {}
    for key, param, dim, part in lora.factors(chunks, adapter):
        join = _vocab_cat(arch.vocab_size) if part == lora.OUTPUT and dim == 0 else _cat(dim)
        items[key] = (param, join)
    for name, param in value_head.trained_in_full(chunks):  # replicated over tp
        items[value_head.peft_full_key(arch, name)] = (param, _cat(None))
    return items


def peft_weights(chunks: list, arch: Architecture, adapter: str) -> Iterator[tuple[str, Tensor]]:
    """Adapter `adapter` as (PEFT key, full tensor) on rank 0."""
    yield from stream_full(lora_items(chunks, arch, adapter))
