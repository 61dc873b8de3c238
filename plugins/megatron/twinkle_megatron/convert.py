"""Weight conversion between Hugging Face names/layouts and Megatron-Core's, for one tensor-parallel shard.

Megatron fuses q/k/v into ``linear_qkv`` (interleaved per key/value group: the group's query heads, then its key,
then its value) and gate/up into ``linear_fc1`` (each tensor-parallel shard holds its slice of gate, then its
slice of up). Column-parallel weights (qkv, fc1, embeddings, output layer) split dim 0 over tp, row-parallel
ones (``linear_proj``, ``linear_fc2``) dim 1; norms and a value model's scalar head (``value_head.weight`` =
HF ``score.weight``) are replicated. Embedding and output rows are padded to the
padded vocabulary with zeros.

`to_megatron(...)` builds one rank's shard of a Megatron parameter from HF tensors; `to_hf(...)` turns a full
(gathered) Megatron tensor back into its HF tensors; `tp_split_dim(name)` says how a parameter is sharded.
Names here are Megatron names relative to one model chunk with global indices: ``decoder.layers.{layer}.…`` and
``….experts.local_experts.{expert}.…`` count over the whole model (`build.base_parameters` makes them so).
"""

from __future__ import annotations

import re
from typing import Callable

import torch
from torch import Tensor

from twinkle_core.train.value_head import HEAD_WEIGHT
from twinkle_megatron.architecture import Architecture

# megatron suffix within a layer -> HF suffix(es) within ``model.layers.{i}.``
_LAYER = {
    'input_layernorm.weight': ('input_layernorm.weight',),
    'self_attention.linear_qkv.weight': (
        'self_attn.q_proj.weight',
        'self_attn.k_proj.weight',
        'self_attn.v_proj.weight',
    ),
    'self_attention.linear_qkv.bias': ('self_attn.q_proj.bias', 'self_attn.k_proj.bias', 'self_attn.v_proj.bias'),
    'self_attention.q_layernorm.weight': ('self_attn.q_norm.weight',),
    'self_attention.k_layernorm.weight': ('self_attn.k_norm.weight',),
    'self_attention.linear_proj.weight': ('self_attn.o_proj.weight',),
    'pre_mlp_layernorm.weight': ('post_attention_layernorm.weight',),
    'mlp.linear_fc1.weight': ('mlp.gate_proj.weight', 'mlp.up_proj.weight'),
    'mlp.linear_fc2.weight': ('mlp.down_proj.weight',),
    'mlp.router.weight': ('mlp.gate.weight',),
}
_EXPERT = re.compile(r'mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight')
_LAYER_NAME = re.compile(r'decoder\.layers\.(\d+)\.(.+)')
_TOP = {
    'embedding.word_embeddings.weight': 'model.embed_tokens.weight',
    'decoder.final_layernorm.weight': 'model.norm.weight',
    'output_layer.weight': 'lm_head.weight',
    'value_head.weight': HEAD_WEIGHT,
}
COLUMN, ROW = 0, 1


def hf_names(arch: Architecture, name: str) -> tuple[str, ...]:
    """The HF tensor names a Megatron parameter is built from (global layer and expert indices)."""
    if name in _TOP:
        if name == 'output_layer.weight' and arch.tied_embeddings:
            return ('model.embed_tokens.weight',)
        return (_TOP[name],)
    match = _LAYER_NAME.fullmatch(name)
    if match is None:
        raise KeyError(f'no Hugging Face counterpart for Megatron parameter {name!r}')
    layer, suffix = match.groups()
    prefix = f'model.layers.{layer}.'
    expert = _EXPERT.fullmatch(suffix)
    if expert is not None:
        e = int(expert.group(1))
        parts = ('gate_proj', 'up_proj') if expert.group(2) == 'linear_fc1' else ('down_proj',)
        return tuple(f'{prefix}mlp.experts.{e}.{p}.weight' for p in parts)
    if suffix not in _LAYER:
        raise KeyError(f'no Hugging Face counterpart for Megatron parameter {name!r}')
    return tuple(prefix + s for s in _LAYER[suffix])


def tp_split_dim(name: str) -> int | None:
    """The dim a parameter is split over tensor-parallel ranks (None: replicated on every tp rank)."""
    if name.endswith(('linear_qkv.weight', 'linear_qkv.bias', 'word_embeddings.weight', 'output_layer.weight')):
        return COLUMN
    if name.endswith('linear_fc1.weight'):
        return COLUMN
    if name.endswith(('linear_proj.weight', 'linear_fc2.weight')):
        return ROW
    return None


def _fuse_qkv(arch: Architecture, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """[nq*d, …], [nkv*d, …], [nkv*d, …] -> Megatron's per-group interleaved [(nq + 2 nkv)*d, …]."""
    groups, d = arch.num_kv_heads, arch.head_dim
    tail = q.shape[1:]
    q = q.reshape(groups, -1, *tail)
    fused = torch.cat([q, k.reshape(groups, d, *tail), v.reshape(groups, d, *tail)], dim=1)
    return fused.reshape(-1, *tail)


def _split_qkv(arch: Architecture, fused: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    groups, d = arch.num_kv_heads, arch.head_dim
    per_group = arch.num_heads // groups * d
    tail = fused.shape[1:]
    grouped = fused.reshape(groups, per_group + 2 * d, *tail)
    q, k, v = grouped.split([per_group, d, d], dim=1)
    return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)


def _pad_rows(t: Tensor, rows: int) -> Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def to_megatron(
    arch: Architecture, name: str, hf: Callable[[str], Tensor], *, tp: int, tp_rank: int, padded_vocab: int
) -> Tensor:
    """Rank `tp_rank`'s shard of Megatron parameter `name`, built from HF tensors fetched by name with `hf`."""
    sources = [hf(n) for n in hf_names(arch, name)]
    dim = tp_split_dim(name)

    def shard(t: Tensor) -> Tensor:
        return t if dim is None or tp == 1 else t.chunk(tp, dim=dim)[tp_rank]

    if name.endswith(('linear_qkv.weight', 'linear_qkv.bias')):
        return shard(_fuse_qkv(arch, *sources))  # whole groups per rank: tp divides the kv heads
    if name.endswith('linear_fc1.weight'):  # per shard: [gate slice; up slice]
        return torch.cat([shard(s) for s in sources])
    if name.endswith(('word_embeddings.weight', 'output_layer.weight')):
        return shard(_pad_rows(sources[0], padded_vocab))
    return shard(sources[0])


def gather_layout(name: str, shards: list[Tensor]) -> Tensor:
    """The full Megatron tensor from its tp shards (in tp-rank order); fc1 shards interleave gate/up."""
    dim = tp_split_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if name.endswith('linear_fc1.weight'):
        gates, ups = zip(*(s.chunk(2, dim=0) for s in shards))
        return torch.cat([*gates, *ups])
    return torch.cat(shards, dim=dim)


def to_hf(arch: Architecture, name: str, full: Tensor) -> list[tuple[str, Tensor]]:
    """HF (name, tensor) pairs of a full (tp-gathered, fc1 gate-then-up) Megatron tensor; padded vocabulary rows
    dropped. A tied output layer yields nothing (the embedding carries the weight)."""
    names = hf_names(arch, name)
    if name == 'output_layer.weight' and arch.tied_embeddings:
        return []
    if name.endswith(('linear_qkv.weight', 'linear_qkv.bias')):
        return list(zip(names, _split_qkv(arch, full)))
    if name.endswith('linear_fc1.weight'):
        return list(zip(names, full.chunk(2, dim=0)))
    if name.endswith(('word_embeddings.weight', 'output_layer.weight')):
        return [(names[0], full[: arch.vocab_size])]
    return [(names[0], full)]
