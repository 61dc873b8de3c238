"""Shared-prefix ("cascade") attention: the first tokens that every prompt of a decode shares are kept once.

The episodes of a rollout, the samples of a GRPO group and the tasks of one environment start with the same
system prompt, tool schemas and rules -- often most of each prompt. Kept per row, those keys/values are copied into
every row and read by every row at every decode step: for small models on a CPU that memory traffic, not the
matmuls, bounds batched decoding. Here the shared first `P` positions are stored once per layer
([kv_heads, P, head_dim], `SharedPrefix`); each row's cache holds only what follows. A step's attention
(`shared_prefix_attention`) scores every row's queries against the shared keys in one batched matmul (each shared
key read once per step, not once per row) and against the row's own keys, and takes one softmax over both --
the same attention as over the concatenated keys, up to floating-point order.

Used by the lean decode step (`FastDecoder`) when at least `MIN_SHARED_TOKENS` tokens are shared by at least two
rows under one adapter (`shared_length`); prompt scoring and the Hugging Face step path never share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

#: fewest shared first tokens worth a separate copy (below it, per-row copies are cheap)
MIN_SHARED_TOKENS = 32


@dataclass
class SharedPrefix:
    """Keys/values [kv_heads, P, head_dim] per layer of the first P positions every row of a batch shares."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return int(self.keys[0].shape[1])


def shared_length(prompts: Sequence[Sequence[int]], adapters: Sequence[str | None], rows: int) -> int:
    """How many first tokens the decode of `prompts` (run as `rows` batch rows) keeps once: their common first
    tokens, leaving each prompt at least one token to prefill (its last position gives the first logits); 0 when
    fewer than two rows, the prompts run under different adapters, or fewer than `MIN_SHARED_TOKENS` are shared."""
    if rows < 2 or not prompts or len(set(adapters)) > 1:
        return 0
    first, shortest = prompts[0], min(len(p) for p in prompts)
    common = shortest - 1
    for prompt in prompts[1:]:
        n = 0
        while n < common and prompt[n] == first[n]:
            n += 1
        common = n
    return common if common >= MIN_SHARED_TOKENS else 0


def shared_prefix_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    shared: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """Attention of `query` [B, H, T, D] over the `shared` (keys, values) [Hkv, P, D], visible to every query, then
    the rows' own `keys`/`values` [B, Hkv, S, D] where `mask` [B, 1, 1 | T, S] (bool) allows; [B, H, T, D].
    Grouped-query heads: query head h reads key/value head h // (H // Hkv), as in `enable_gqa`."""
    batch, heads, count, dim = query.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    shared_keys, shared_values = shared
    prefix = shared_keys.shape[1]
    group = heads // kv_heads
    grouped = query.reshape(batch, kv_heads, group * count, dim)
    own = torch.matmul(grouped, keys.transpose(-1, -2)) * scale  # [B, Hkv, G*T, S]
    visible = mask.expand(batch, 1, count, length).unsqueeze(2).expand(batch, 1, group, count, length)
    own = own.masked_fill(~visible.reshape(batch, 1, group * count, length), float('-inf'))
    by_head = grouped.transpose(0, 1).reshape(kv_heads, batch * group * count, dim)
    common = torch.bmm(by_head, shared_keys.transpose(1, 2)) * scale  # [Hkv, B*G*T, P]
    common = common.view(kv_heads, batch, group * count, prefix).transpose(0, 1)
    probs = torch.softmax(torch.cat([common, own], dim=-1), dim=-1, dtype=torch.float32).to(values.dtype)
    from_shared = torch.bmm(
        probs[..., :prefix].transpose(0, 1).reshape(kv_heads, batch * group * count, prefix), shared_values
    ).view(kv_heads, batch, group * count, dim)
    out = from_shared.transpose(0, 1) + torch.matmul(probs[..., prefix:], values)
    return out.reshape(batch, heads, count, dim)
