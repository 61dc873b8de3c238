"""Ulysses sequence parallelism (DeepSpeed-Ulysses) for Hugging Face decoders: the mesh's ``cp`` dimension.

The ranks of one ``cp`` group see the same rows. Each runs the decoder on its contiguous 1/N of every row
(`shard_batch`: the sequence is padded to a multiple of N, each rank takes its slice of tokens, positions and
targets), so activations, MLPs and the log-prob head cost 1/N per rank. Attention needs the whole sequence:
`ulysses_attention` swaps the sequence split for a head split with one all-to-all (each rank then holds 1/N of the
heads over all tokens), attends with PyTorch SDPA over the full rows -- per sequence for padding-free batches, from
the full ``cu_seqlens`` -- and swaps back with a second all-to-all. The per-token log-probs of the slices are
then gathered (`gather_sequence`), so every loss runs unchanged on whole rows, identically on every rank of the
group.

Gradients: the gather's backward sums the group's (identical) gradients, N times the true one on each rank's own
tokens; the data-parallel averaging over all ranks (DDP, or FSDP2 sharding over ``fsdp`` x ``cp``) divides by N
again, which gives the single-process gradient without any extra scaling.

Contract: ``num_attention_heads`` and ``num_key_value_heads`` must be divisible by N (`check_supported` says so); the
attention runs through SDPA whatever ``attn_implementation`` the model was loaded with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from twinkle_core.errors import MeshError
from twinkle_core.loss.chunking import unwrap_causal_lm
from twinkle_core.types import IGNORE_INDEX
from twinkle_transformers.attention import varlen_sdpa_attention

ATTN_IMPLEMENTATION = 'twinkle_ulysses'
#: the keyword that carries the `SequenceShard` from the model call to `ulysses_attention`
SHARD_KWARG = 'sequence_parallel'
_GROUP_ATTR = '_twinkle_sequence_parallel_group'
_registered = False


@dataclass(frozen=True)
class SequenceShard:
    """One rank's part of a batch split along the sequence, and what attention needs of the whole rows."""

    group: Any  # the process group of the cp ranks
    size: int
    rank: int
    length: int  # the batch's sequence length
    padded_length: int  # `length` rounded up to a multiple of `size`
    key_mask: Tensor | None  # [B, padded_length] bool, True on tokens; None: no padding but the split's own, at
    # the rows' ends, which causal attention shows to nothing but itself
    cu_seqlens: Tensor | None  # padding-free batches: the sequences' borders in the (padded) row, int32

    @property
    def local_length(self) -> int:
        return self.padded_length // self.size

    @property
    def bounds(self) -> tuple[int, int]:
        return self.rank * self.local_length, (self.rank + 1) * self.local_length


def check_supported(model: torch.nn.Module, size: int) -> None:
    """Raise `MeshError` unless `model` can split its sequences over `size` ranks: a text-only decoder whose
    query and key/value head counts `size` divides."""
    from twinkle_transformers import vision

    config: Any = unwrap_causal_lm(model).config
    if vision.is_vision_language(config):
        raise MeshError(
            'sequence parallelism (cp_size > 1) is not available for vision-language models on the Transformers '
            'backend; use gradient_checkpointing=True for long multimodal rows.'
        )
    text_config = config.get_text_config()
    for field in ('num_attention_heads', 'num_key_value_heads'):
        heads = getattr(text_config, field, None)
        if heads is not None and heads % size:
            raise MeshError(
                f'sequence parallelism over cp_size={size} ranks splits the attention heads across them, but '
                f'{field}={heads} is not divisible by {size}; pick a cp_size that divides it.'
            )


def enable(model: torch.nn.Module, group: Any) -> None:
    """Make `model` split sequences over the process `group` (its ``cp`` ranks): check it (`check_supported`),
    route its attention through `ulysses_attention` and remember the group (`group_of`)."""
    check_supported(model, dist.get_world_size(group))
    _register()
    config: Any = unwrap_causal_lm(model).config
    for sub_config in {id(c): c for c in (config, config.get_text_config())}.values():
        sub_config._attn_implementation = ATTN_IMPLEMENTATION
    setattr(model, _GROUP_ATTR, group)


def group_of(model: torch.nn.Module) -> Any:
    """The process group `model` splits sequences over, or None."""
    return getattr(model, _GROUP_ATTR, None)


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        # no mask function: transformers then builds no [T/N, T/N] mask of the slice (`_full_mask` makes the one
        # attention needs, over whole rows, only where padding calls for one)
        AttentionInterface.register(ATTN_IMPLEMENTATION, ulysses_attention)
        _registered = True


# ---- the batch ----------------------------------------------------------------------------------------------
def shard_batch(batch: dict[str, Any], group: Any) -> tuple[dict[str, Any], SequenceShard]:
    """This rank's slice of a collated batch along the sequence (``input_ids``, ``position_ids``, ``target_ids``,
    ``labels``; padded to a multiple of the group size with ignored tokens) and its `SequenceShard`."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    input_ids = batch['input_ids']
    length = input_ids.shape[1]
    padded = -(-length // size) * size
    pad = padded - length
    mask = batch.get('attention_mask')
    key_mask = None
    if mask is not None and not bool(mask.all()):
        key_mask = torch.nn.functional.pad(mask.bool(), (0, pad), value=False)
    cu_seqlens = None
    if batch.get('packed') and batch.get('cu_seqlens') is not None:
        cu_seqlens = batch['cu_seqlens'].to(device=input_ids.device, dtype=torch.int32)
    shard = SequenceShard(group, size, rank, length, padded, key_mask, cu_seqlens)
    start, end = shard.bounds
    position_ids = batch['position_ids']
    if pad:
        tail = position_ids[:, -1:] + torch.arange(1, pad + 1, device=position_ids.device)
        position_ids = torch.cat([position_ids, tail], dim=1)
    local = {
        **batch,
        'input_ids': _pad_to(input_ids, padded, 0)[:, start:end],
        'position_ids': position_ids[:, start:end],
        'target_ids': _pad_to(batch['target_ids'], padded, IGNORE_INDEX)[:, start:end],
        'labels': _pad_to(batch['labels'], padded, IGNORE_INDEX)[:, start:end],
        'attention_mask': None,
        'packed': False,
        'cu_seqlens': None,
    }
    return local, shard


def _pad_to(x: Tensor, length: int, value: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, length - x.shape[1]), value=value) if x.shape[1] < length else x


class _GatherSequence(torch.autograd.Function):
    """[B, T/N, ...] on each rank -> [B, T, ...] on every rank; the backward sums the ranks' gradients of the
    whole rows (a reduce-scatter, done as all-reduce + slice: gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, shard: SequenceShard) -> Tensor:
        ctx.shard = shard
        return _all_gather_cat(x, shard)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.clone(memory_format=torch.contiguous_format)  # autograd may hold the incoming one elsewhere
        dist.all_reduce(grad, group=ctx.shard.group)
        start, end = ctx.shard.bounds
        return grad[:, start:end], None


def gather_sequence(x: Tensor, shard: SequenceShard) -> Tensor:
    """Concatenate the ranks' slices of `x` ([B, T/N, ...]) along the sequence and drop the padding: [B, T, ...].
    Differentiable for float tensors."""
    full = _GatherSequence.apply(x, shard) if x.is_floating_point() and x.requires_grad else _all_gather_cat(x, shard)
    return full[:, : shard.length]


def _all_gather_cat(x: Tensor, shard: SequenceShard) -> Tensor:
    parts = [torch.empty_like(x) for _ in range(shard.size)]
    dist.all_gather(parts, x.contiguous(), group=shard.group)
    return torch.cat(parts, dim=1)


# ---- attention ----------------------------------------------------------------------------------------------
class _SwapSplit(torch.autograd.Function):
    """All-to-all over the group: [B, H, T/N, D] (all heads, my tokens) <-> [B, H/N, T, D] (my heads, all
    tokens). ``to_heads`` picks the direction; the backward is the opposite swap."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, shard: SequenceShard, to_heads: bool) -> Tensor:
        ctx.shard, ctx.to_heads = shard, to_heads
        return _swap(x, shard, to_heads)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return _swap(grad, ctx.shard, not ctx.to_heads), None, None


def _swap(x: Tensor, shard: SequenceShard, to_heads: bool) -> Tensor:
    n = shard.size
    b, h, t, d = x.shape
    if to_heads:  # send head group j to rank j; receive my head group of every rank's tokens
        send = x.reshape(b, n, h // n, t, d).transpose(0, 1).contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send, group=shard.group)
        return received.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * t, d)
    # back: send token slice j of my heads to rank j; receive every rank's heads of my tokens
    send = x.reshape(b, h, n, t // n, d).permute(2, 0, 1, 3, 4).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=shard.group)
    return received.transpose(0, 1).reshape(b, n * h, t // n, d)


def ulysses_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention-interface function: query [B, H, T/N, D] (this rank's tokens), key/value [B, H_kv, T/N, D] ->
    output [B, T/N, H, D]. The model call must carry its `SequenceShard` (``forward_logps`` passes it)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    shard: SequenceShard | None = kwargs.pop(SHARD_KWARG, None)
    if shard is None:
        raise MeshError(
            'this model splits sequences over its cp ranks (sequence parallelism) and must be called with its '
            f'rows split: run it through twinkle_transformers.forward.forward_logps, which passes {SHARD_KWARG}=.'
        )
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith(('cu_seq_lens', 'max_length'))}
    q, k, v = (_SwapSplit.apply(x, shard, True) for x in (query, key, value))
    if shard.cu_seqlens is not None:
        out, _ = varlen_sdpa_attention(
            module, q, k, v, None, dropout, scaling, True, cu_seq_lens_q=shard.cu_seqlens, **kwargs
        )
    else:
        mask = _full_mask(shard, q.device)
        out, _ = sdpa_attention_forward(
            module, q, k, v, mask, dropout=dropout, scaling=scaling, is_causal=mask is None, **kwargs
        )
    out = _SwapSplit.apply(out.transpose(1, 2), shard, False)  # [B, H/N, T, D] -> [B, H, T/N, D]
    return out.transpose(1, 2).contiguous(), None


def _full_mask(shard: SequenceShard, device: torch.device) -> Tensor | None:
    """Causal mask over the whole rows that also hides padding keys ([B, 1, T, T] bool), or None: plain causal."""
    if shard.key_mask is None:
        return None
    t = shard.padded_length
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril_()
    mask = causal[None] & shard.key_mask.to(device)[:, None, :]
    mask |= torch.eye(t, dtype=torch.bool, device=device)  # a padding query sees itself: no empty row
    return mask[:, None]
