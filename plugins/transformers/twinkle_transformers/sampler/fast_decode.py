"""A lean decode step for Llama-family decoders (Llama, Mistral, Qwen2, Qwen3), used after the Hugging Face prefill.

Per generated token the HF forward re-derives attention masks, grows the KV cache by concatenation, expands KV
heads for GQA and runs several Python wrappers per layer. This step does the same math (same weights, same
RoPE module, fp32-identical results) with: a preallocated KV cache written in place, one boolean key mask,
`scaled_dot_product_attention(enable_gqa=True)` (or, when the rows share their first positions, attention that
reads those once: `shared_prefix.py`), fused `F.rms_norm`, and -- for a model the sampler owns -- q/k/v
and gate/up projections fused into single matmuls whose original parameters become views of the fused tensor
(no extra memory; in-place weight loads keep both in sync).

Projections that are not plain `nn.Linear` (e.g. twinkle multi-LoRA layers) are called as modules, so per-row
adapter routing keeps working. Anything outside the supported family (other architectures, sliding-window
layers, PEFT-wrapped models whose mixed-adapter routing needs PEFT's forward hooks) returns None from
`FastDecoder.for_model` and the caller uses the plain HF forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from twinkle_transformers.sampler.shared_prefix import SharedPrefix, shared_prefix_attention

SUPPORTED_MODEL_TYPES = frozenset({'llama', 'mistral', 'qwen2', 'qwen3'})


def full_attention_only(config: Any) -> bool:
    """Whether every layer is plain full attention: no sliding-window or linear-attention layers."""
    if any(t != 'full_attention' for t in (getattr(config, 'layer_types', None) or [])):
        return False
    return not (getattr(config, 'sliding_window', None) and getattr(config, 'use_sliding_window', True))


@dataclass
class StaticKVCache:
    """Per layer keys/values [B, kv_heads, capacity, head_dim]; `length` positions are filled. `shared`: first
    positions every row attends to, kept once (`shared_prefix.py`); the rows' columns follow them."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int
    shared: SharedPrefix | None = None

    @classmethod
    def from_dynamic(cls, cache: Any, rows: torch.Tensor, capacity: int) -> StaticKVCache:
        """Copy a prefilled HF `DynamicCache` (rows picked by `rows`, e.g. fanned out per sample)."""
        keys, values = [], []
        for layer in cache.layers:
            k, v = layer.keys, layer.values
            shape = (len(rows), k.shape[1], capacity, k.shape[3])
            kb, vb = k.new_empty(shape), v.new_empty(shape)
            kb[:, :, : k.shape[2]] = k[rows]
            vb[:, :, : v.shape[2]] = v[rows]
            keys.append(kb)
            values.append(vb)
        return cls(keys, values, cache.layers[0].keys.shape[2])

    def select(self, rows: torch.Tensor) -> None:
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]


class _RMSNormLike(Protocol):
    """An HF RMSNorm module (its class differs per architecture); `variance_epsilon` is read when present."""

    weight: torch.Tensor


class FastDecoder:
    """One-token decode steps for a supported model. Build with `for_model`."""

    def __init__(self, model: Any) -> None:
        # `model`: an HF Llama-family causal LM (checked by `for_model`); its submodules (lm_head, model.layers ...)
        # are attributes found at runtime, which `nn.Module.__getattr__` can only type as `Tensor | Module`
        self.model = model
        self.config = model.config
        self.body = model.model
        self.eps: float = self.config.rms_norm_eps
        self._projections: list[tuple[Projection, Projection]] = []
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None

    def prepare(self, positions: int) -> None:
        """Set up the decode that follows (positions below `positions`): resolve each layer's projections (fused
        or per module) and tabulate RoPE. Weights and modules must not be swapped until it ends."""
        self._projections = [
            (
                Projection([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                Projection([layer.mlp.gate_proj, layer.mlp.up_proj]),
            )
            for layer in self.body.layers
        ]
        embed = self.body.embed_tokens.weight
        all_positions = torch.arange(positions, device=embed.device)[None]
        cos, sin = self.body.rotary_emb(embed[:1][None], all_positions)  # same values as per-step calls
        self._rope_table = (cos[0], sin[0])

    @classmethod
    def for_model(cls, model: nn.Module, *, fuse: bool) -> FastDecoder | None:
        """A decoder for `model`, or None when it is not a plain Llama-family causal LM. `fuse`: fuse projection
        weights in place (only for a model the caller owns: parameters are replaced by views)."""
        config = getattr(model, 'config', None)
        if (
            getattr(config, 'model_type', None) not in SUPPORTED_MODEL_TYPES
            or hasattr(model, 'peft_config')
            or getattr(config, 'hidden_act', None) != 'silu'
            or getattr(config, 'pretraining_tp', 1) != 1
            or not isinstance(getattr(model, 'lm_head', None), nn.Linear)
        ):
            return None
        if not full_attention_only(config):
            return None
        if fuse:
            body: Any = model.model  # checked above: a Llama-family decoder
            for layer in body.layers:
                attn, mlp = layer.self_attn, layer.mlp
                fuse_linears([attn.q_proj, attn.k_proj, attn.v_proj])
                fuse_linears([mlp.gate_proj, mlp.up_proj])
        return cls(model)

    def new_cache(self, batch: int, capacity: int) -> StaticKVCache:
        """An empty cache (zeros: masked positions must hold finite values) for `batch` rows."""
        config, embed = self.config, self.body.embed_tokens.weight
        head_dim = getattr(config, 'head_dim', None) or config.hidden_size // config.num_attention_heads
        shape = (batch, config.num_key_value_heads, capacity, head_dim)
        layers = range(len(self.body.layers))
        return StaticKVCache(
            [embed.new_zeros(shape) for _ in layers], [embed.new_zeros(shape) for _ in layers], length=0
        )

    @torch.inference_mode()
    def step(
        self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticKVCache, key_mask: torch.Tensor
    ) -> torch.Tensor:
        """Logits [B, V] after the last of `tokens` [B, T] (or [B]) at `positions` [B, T]; appends their
        keys/values to `cache`. `key_mask` [B, >= cache.length + T] (bool): the positions each row may attend to;
        among the T new ones attention is causal, and each attends to itself (so a masked pad row stays finite)."""
        tokens = tokens if tokens.dim() == 2 else tokens[:, None]
        batch, count = tokens.shape
        x = self.body.embed_tokens(tokens)
        assert self._rope_table is not None, 'call prepare() first'
        cos, sin = (table[positions][:, None] for table in self._rope_table)
        slot = cache.length
        mask = key_mask[:, None, None, : slot + count]
        if count > 1:
            eye = torch.eye(count, dtype=torch.bool, device=mask.device)
            causal = torch.cat([eye.new_ones(count, slot), eye.new_ones(count, count).tril()], dim=1)
            mask = (mask & causal) | torch.cat([eye.new_zeros(count, slot), eye], dim=1)
        for index, (layer, (qkv, gate_up)) in enumerate(zip(self.body.layers, self._projections)):
            attn = layer.self_attn
            h = self._norm(x, layer.input_layernorm)
            q, k, v = qkv(h)
            head_dim = attn.head_dim
            q = q.view(batch, count, -1, head_dim)
            k = k.view(batch, count, -1, head_dim)
            if getattr(attn, 'q_norm', None) is not None:  # Qwen3: per-head RMSNorm of queries and keys
                q, k = self._norm(q, attn.q_norm), self._norm(k, attn.k_norm)
            q, k = _rope(q.transpose(1, 2), cos, sin), _rope(k.transpose(1, 2), cos, sin)
            keys, values = cache.keys[index], cache.values[index]
            keys[:, :, slot : slot + count] = k
            values[:, :, slot : slot + count] = v.view(batch, count, -1, head_dim).transpose(1, 2)
            if cache.shared is None:
                out = F.scaled_dot_product_attention(
                    q,
                    keys[:, :, : slot + count],
                    values[:, :, : slot + count],
                    attn_mask=mask,
                    scale=attn.scaling,
                    enable_gqa=True,
                )
            else:
                shared = (cache.shared.keys[index], cache.shared.values[index])
                out = shared_prefix_attention(
                    q, keys[:, :, : slot + count], values[:, :, : slot + count], mask, attn.scaling, shared
                )
            x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, count, -1))
            h = self._norm(x, layer.post_attention_layernorm)
            gate, up = gate_up(h)
            x = x + layer.mlp.down_proj(F.silu(gate) * up)
        cache.length = slot + count
        return self.model.lm_head(self._norm(x[:, -1:], self.body.norm))[:, -1]

    def _norm(self, x: torch.Tensor, norm: _RMSNormLike) -> torch.Tensor:
        """HF's RMSNorm: normalise in fp32, cast back, scale (one fused kernel when that order cannot matter)."""
        eps = getattr(norm, 'variance_epsilon', self.eps)
        if x.dtype == torch.float32 and norm.weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), norm.weight, eps)
        return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Projection:
    """Several projections of the same input: one matmul when they are fused plain Linears, else one call each."""

    def __init__(self, linears: list[nn.Module]) -> None:
        self.linears = linears
        self.fused = _fused_weight(linears)
        self.sizes = [lin.out_features for lin in linears]

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self.fused is None:
            return [lin(x) for lin in self.linears]
        weight, bias = self.fused
        return list(F.linear(x, weight, bias).split(self.sizes, dim=-1))


def _plain_linears(linears: Sequence[nn.Module]) -> TypeGuard[Sequence[nn.Linear]]:
    """True when every module is exactly `nn.Linear` (no subclass such as a LoRA layer)."""
    return all(type(lin) is nn.Linear for lin in linears)


def fuse_linears(linears: Sequence[nn.Module]) -> None:
    """Make the weights (and biases) of plain Linears with the same input views of one concatenated tensor."""
    if not _plain_linears(linears) or _fused_weight(linears) is not None:
        return
    for attr in ('weight', 'bias'):
        params = [getattr(lin, attr) for lin in linears]
        if any(p is None for p in params):
            continue
        fused = torch.cat([p.detach() for p in params])
        offset = 0
        for lin, p in zip(linears, params):
            rows = p.shape[0]
            setattr(lin, attr, nn.Parameter(fused[offset : offset + rows], requires_grad=p.requires_grad))
            offset += rows


def _fused_weight(linears: Sequence[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) spanning `linears` when they are plain Linears whose parameters are consecutive views."""
    if not _plain_linears(linears):
        return None
    weight = _contiguous_span([lin.weight for lin in linears])
    if weight is None:
        return None
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        return weight, None
    bias = _contiguous_span(biases) if all(b is not None for b in biases) else None
    return (weight, bias) if bias is not None else None


def _contiguous_span(params: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One tensor covering `params` when they lie back to back (in order) in one storage, else None."""
    first = params[0]
    storage = first.untyped_storage().data_ptr()
    offset = first.storage_offset()
    for p in params:
        if (
            not p.is_contiguous()
            or p.untyped_storage().data_ptr() != storage
            or p.storage_offset() != offset
            or p.shape[1:] != first.shape[1:]
        ):
            return None
        offset += p.numel()
    rows = sum(p.shape[0] for p in params)
    shape = (rows, *first.shape[1:])
    return first.detach().as_strided(shape, first.stride(), first.storage_offset())
