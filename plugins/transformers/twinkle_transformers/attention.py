"""``twinkle_sdpa``: PyTorch SDPA that runs packed (padding-free) batches one sequence at a time.

With plain ``sdpa``, a packed row of total length T attends through a dense [T, T] block-diagonal mask: the
kernel does T^2 work although only sum(n_i^2) is needed, which on CPU eats most of the padding-free gain.
``twinkle_sdpa`` splits a packed row at its sequence borders (``cu_seq_lens_q`` from the processor, or where
``position_ids`` restart -- only when the mask transformers built from them is block-diagonal) and calls SDPA
per sequence with ``is_causal=True``: the CPU counterpart of flash-attention's varlen kernel. Anything else
(padded batches, decoding with a KV cache) is plain ``sdpa``.

Correctness does not depend on the split: each sequence's slice of the mask transformers built is used as is
unless it is exactly causal (sliding windows and model-specific masks are kept).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

ATTN_IMPLEMENTATION = 'twinkle_sdpa'
_registered = False


def register() -> str:
    """Register ``twinkle_sdpa`` with transformers' attention and mask interfaces (idempotent); returns the name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(ATTN_IMPLEMENTATION, varlen_sdpa_attention)
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
        _registered = True
    return ATTN_IMPLEMENTATION


def sequence_bounds(kwargs: dict[str, Any], length: int) -> list[int] | None:
    """Start offsets of the packed sequences plus the end of the last one, or None when not packed."""
    cu = kwargs.get('cu_seq_lens_q')
    if cu is not None:
        return [int(x) for x in cu.tolist()]
    position_ids = kwargs.get('position_ids')
    if position_ids is None or position_ids.shape[0] != 1 or position_ids.shape[-1] != length:
        return None
    pos = position_ids[0]
    starts = torch.nonzero(pos[1:] != pos[:-1] + 1).flatten() + 1
    if starts.numel() == 0:
        return None
    return [0, *starts.tolist(), length]


def varlen_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention-interface function: query [1, H, T, D], key/value [1, H_kv, T, D] -> output [1, T, H, D]."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    bounds = None
    if query.shape[0] == 1 and query.shape[2] == key.shape[2] and query.shape[2] > 1:
        bounds = sequence_bounds(kwargs, query.shape[2])
        if bounds is not None and kwargs.get('cu_seq_lens_q') is None and _crosses(attention_mask, bounds):
            bounds = None  # restarting position_ids, but the mask lets sequences see each other: not packed
    if bounds is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    groups = getattr(module, 'num_key_value_groups', 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    dropout = dropout if module.training else 0.0
    output = query.new_zeros(query.shape)  # positions after the last sequence (padding) stay 0
    for start, end in zip(bounds[:-1], bounds[1:]):
        mask = _segment_mask(attention_mask, start, end)
        output[:, :, start:end] = F.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=mask is None,
            scale=scaling,
        )
    return output.transpose(1, 2).contiguous(), None


def _crosses(mask: torch.Tensor | None, bounds: list[int]) -> bool:
    """Whether `mask` allows any attention between the segments `bounds` delimit (unknown masks: True)."""
    if mask is None:
        return True  # no mask means plain causal attention over the whole row
    if mask.dtype != torch.bool:
        return True
    segment = torch.repeat_interleave(
        torch.arange(len(bounds) - 1, device=mask.device), torch.tensor(bounds, device=mask.device).diff()
    )
    other = segment[:, None] != segment[None, :]
    return bool((mask[0, 0, : len(segment), : len(segment)] & other).any())


def _segment_mask(mask: torch.Tensor | None, start: int, end: int) -> torch.Tensor | None:
    """The mask of one sequence, or None when it is exactly causal (then SDPA's causal kernel is used)."""
    if mask is None:
        return None
    block = mask[..., start:end, start:end]
    if block.dtype == torch.bool:
        n = end - start
        causal = torch.ones(n, n, dtype=torch.bool, device=block.device).tril_()
        if bool((block == causal).all()):
            return None
    return block
