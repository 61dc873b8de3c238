"""The decode steps of `decoding.BatchDecoder` after the prefill: through the model's own Hugging Face forward and a
growing cache (`HFStepper`, any causal LM), or through `FastDecoder` over a preallocated cache (`FastStepper`, the
Llama family). Both keep only the rows still decoding and give a finished row's cache to the prefix cache."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Protocol

import torch

from twinkle_transformers.sampler.fast_decode import FastDecoder, StaticKVCache

# adapter name per batch row (None = base weights) -> (context, extra forward kwargs) running rows that way
Route = Callable[[list['str | None']], tuple[contextlib.AbstractContextManager[Any], dict[str, Any]]]


class Stepper(Protocol):
    """One decode step for every row of the batch, over the prefilled (and fanned-out) cache."""

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, adapters: list[str | None]) -> torch.Tensor:
        """Logits [B, V] for the next token of each row."""

    def select(self, index: torch.Tensor) -> None:
        """Keep only these batch rows."""

    def row_cache(self, row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One row's cached keys and values per layer [kv_heads, n, head_dim], its n unmasked positions only."""


class HFStepper:
    """Decode steps through the model's own forward and a growing `DynamicCache`. Rows are picked with the cache's
    `reorder_cache` (an index select of every layer's state: keys/values, and the conv/recurrent states of
    linear-attention layers, which have no `batch_select_indices`)."""

    def __init__(self, forward: Callable[..., Any], cache: Any, fan_out: torch.Tensor, key_mask: torch.Tensor) -> None:
        cache.reorder_cache(fan_out)  # `forward(adapters, **hf_kwargs)`: the model's forward, routed per row
        self.forward, self.cache, self.key_mask = forward, cache, key_mask
        self.length = cache.get_seq_length()

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, adapters: list[str | None]) -> torch.Tensor:
        self.length += 1
        return self.forward(
            adapters,
            input_ids=tokens.unsqueeze(-1),
            past_key_values=self.cache,
            attention_mask=self.key_mask[:, : self.length],
            position_ids=positions,
            logits_to_keep=1,
        ).logits[:, -1]

    def select(self, index: torch.Tensor) -> None:
        self.cache.reorder_cache(index)
        self.key_mask = self.key_mask[index]

    def row_cache(self, row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        valid = self.key_mask[row, : self.length].bool()
        layers = self.cache.layers
        return [layer.keys[row][:, valid] for layer in layers], [layer.values[row][:, valid] for layer in layers]


class FastStepper:
    """Decode steps through `FastDecoder` over a preallocated cache. Finished rows stay in the cache (computed
    and ignored) until at most half of its rows are live, then the cache is compacted: dropping rows costs a few
    whole-cache copies per decode instead of one per finishing step."""

    def __init__(self, fast: FastDecoder, cache: StaticKVCache, key_mask: torch.Tensor, route: Route) -> None:
        self.fast, self.route, self.cache = fast, route, cache
        self.key_mask = key_mask.bool()
        self.live: torch.Tensor | None = None  # cache row of each batch row; None: the same rows

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, adapters: list[str | None]) -> torch.Tensor:
        if self.live is not None:  # finished rows get token 0 at position 0 and the base weights
            live, rows = self.live, self.key_mask.shape[0]
            tokens = tokens.new_zeros(rows).index_copy(0, live, tokens)
            positions = positions.new_zeros((rows, 1)).index_copy(0, live, positions)
            routed: list[str | None] = [None] * rows
            for row, adapter in zip(live.tolist(), adapters):
                routed[row] = adapter
            adapters = routed
        context, _ = self.route(adapters)
        with context:
            logits = self.fast.step(tokens, positions, self.cache, self.key_mask)
        return logits if self.live is None else logits[self.live]

    def select(self, index: torch.Tensor) -> None:
        live = index if self.live is None else self.live[index]
        if 2 * len(live) <= self.key_mask.shape[0]:
            self.cache.select(live)
            self.key_mask, self.live = self.key_mask[live], None
        else:
            self.live = live

    def row_cache(self, row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        length, shared = self.cache.length, self.cache.shared
        row = row if self.live is None else int(self.live[row])
        valid = self.key_mask[row, :length]
        keys = [k[row, :, :length][:, valid] for k in self.cache.keys]
        values = [v[row, :, :length][:, valid] for v in self.cache.values]
        if shared is None:
            return keys, values
        return (
            [torch.cat([s, k], dim=1) for s, k in zip(shared.keys, keys)],
            [torch.cat([s, v], dim=1) for s, v in zip(shared.values, values)],
        )
