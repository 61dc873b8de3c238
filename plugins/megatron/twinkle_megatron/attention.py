"""`SDPAttention`: the core attention of the local layer spec, on PyTorch's `scaled_dot_product_attention`.

megatron-core's local `DotProductAttention` materialises the scores (``baddbmm``), masks them with -10000 and
runs a separate softmax and ``bmm``, repeating grouped key/value heads first. SDPA does the same maths in one
fused kernel (flash / memory-efficient on CPU and GPU), shares grouped key/value heads without copies, and
takes ``is_causal`` when there is no mask (right-padded batches: real tokens never see the padding that follows
them) or the boolean block mask of a padding-free batch. Same interface as `DotProductAttention`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


class SDPAttention(torch.nn.Module):
    """Drop-in for megatron's `DotProductAttention` (query/key/value ``[s, b, heads, d]`` -> ``[s, b, heads*d]``).

    `attention_mask`: None (causal) or Megatron's boolean mask ``[b, 1, s, s]`` (True = masked)."""

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__()
        if config.context_parallel_size != 1:
            raise ValueError('SDPAttention has no context parallelism (it needs TransformerEngine attention).')
        self.config = config
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError(
                'SDPAttention takes padding-free batches as a block mask, not packed_seq_params, and no attention bias.'
            )
        s, b, heads, d = query.shape
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        mask = None if attention_mask is None else ~attention_mask  # SDPA: True = attend
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.softmax_scale,
            enable_gqa=k.shape[1] != heads,
        )
        return out.permute(2, 0, 1, 3).reshape(s, b, heads * d)
