"""Prefix caching: the keys/values of earlier `sample` calls reused by later prompts that extend them.

A multi-turn rollout samples a turn, appends the tool or environment reply and samples again: each prompt is the
previous prompt plus the sampled tokens plus a few new ones. Without reuse every turn prefills the whole episode
again, so prefill grows with the square of the turn count and dominates a rollout. `PrefixCache` keeps, per
finished sequence, the keys/values of every position the decode computed (the prompt and all sampled tokens but
the last, which was never fed back), keyed by (adapter, those tokens). A later prompt prefills only what follows
the longest first part it shares with a stored sequence (`prefill_layout`, `write_prefixes`): the whole previous
turn of its episode, or a system prompt it shares with other prompts (matches of at least one `BLOCK_TOKENS`
block, found through a block-hash index).

Contract:
- reuse is exact: a prompt reuses stored positions only when its tokens up to there equal them, under the same
  adapter and the same weights (`check_weights` drops everything when the weights' fingerprint changed: a weight
  load, an adapter added or removed, an optimizer step on a shared model);
- the results are the model's own up to floating-point differences between batch shapes, as for any batching;
- memory is bounded by `max_bytes` (least recently used entries go first; an entry above the whole budget is
  not stored); ``max_bytes=0`` turns the cache off.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

from twinkle_transformers.sampler.fast_decode import full_attention_only
from twinkle_transformers.vision import is_vision_language

#: the default budget of a sampler's prefix cache (bytes of keys/values, on the model's device)
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30


@dataclass
class CachedSequence:
    """The keys/values [kv_heads, len(tokens), head_dim] of one layer each, for `tokens` (no padding)."""

    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def first(self, n: int) -> CachedSequence:
        """The first `n` positions (views of this entry's tensors)."""
        if n == len(self.tokens):
            return self
        return CachedSequence(self.tokens[:n], [k[:, :n] for k in self.keys], [v[:, :n] for v in self.values])

    def after(self, n: int) -> CachedSequence | None:
        """The positions after the first `n` (views), None when there are none."""
        if n == 0:
            return self
        if n >= len(self.tokens):
            return None
        return CachedSequence(self.tokens[n:], [k[:, n:] for k in self.keys], [v[:, n:] for v in self.values])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class PrefixCacheStats:
    """Counters since the sampler was built: prompts looked up, prompts that reused a stored sequence, their
    prompt tokens and the tokens whose prefill was skipped."""

    prompts: int = 0
    hits: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


#: tokens per block of the prefix index: a prompt finds a stored sequence by its first whole blocks
BLOCK_TOKENS = 16

_Key = tuple['str | None', tuple[int, ...]]


def block_hashes(adapter: str | None, tokens: Sequence[int], limit: int) -> list[int]:
    """Chained hashes of the whole `BLOCK_TOKENS` blocks among the first `limit` tokens: hash k covers blocks 0..k
    (and the adapter), so equal hashes mean equal prefixes (up to a hash collision, which lookups check)."""
    hashes, running = [], hash(adapter)
    for end in range(BLOCK_TOKENS, limit + 1, BLOCK_TOKENS):
        running = hash((running, tuple(tokens[end - BLOCK_TOKENS : end])))
        hashes.append(running)
    return hashes


class PrefixCache:
    """Stored sequences by (adapter, tokens), least recently used first, within `max_bytes`, indexed by the hashes
    of their whole blocks."""

    def __init__(self, max_bytes: int = DEFAULT_PREFIX_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f'prefix cache max_bytes must be >= 0, got {max_bytes}.')
        self.max_bytes = max_bytes
        self.bytes = 0
        self.stats = PrefixCacheStats()
        self._entries: OrderedDict[_Key, CachedSequence] = OrderedDict()
        self._holders: dict[int, dict[_Key, None]] = {}  # block hash -> the entries that start with that prefix
        self._weights: Hashable = None

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._holders.clear()
        self.bytes = 0

    def check_weights(self, fingerprint: Hashable) -> None:
        """Drop every entry when the weights' `fingerprint` differs from the one the entries were computed with."""
        if fingerprint != self._weights:
            self.clear()
            self._weights = fingerprint

    def longest_prefix(self, adapter: str | None, tokens: Sequence[int]) -> CachedSequence | None:
        """The longest first part of `tokens` (at least one whole block, at most all tokens but the last, which the
        prefill must compute) whose keys/values a stored sequence holds: that sequence's first positions (views,
        no copy), or None."""
        self.stats.prompts += 1
        self.stats.prompt_tokens += len(tokens)
        usable = len(tokens) - 1
        hashes = block_hashes(adapter, tokens, usable)
        for blocks in range(len(hashes), 0, -1):
            best, length = None, 0
            for key in self._holders.get(hashes[blocks - 1], ()):
                entry = self._entries[key]
                n = _common_prefix(entry.tokens, tokens, usable)
                if n >= blocks * BLOCK_TOKENS and n > length:
                    best, length = key, n
            if best is not None:
                self._entries.move_to_end(best)
                self.stats.hits += 1
                self.stats.reused_tokens += length
                return self._entries[best].first(length)
        return None

    def store(self, adapter: str | None, entry: CachedSequence, extends: CachedSequence | None = None) -> None:
        """Keep `entry` (computed under `adapter`); evict the least recently used beyond the budget. `extends`: the
        stored prefix its prompt reused; a whole stored sequence that `entry` extends is dropped (its positions are
        `entry`'s first ones)."""
        key = (adapter, entry.tokens)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        size = entry.nbytes
        if not self.enabled or size > self.max_bytes or len(entry.tokens) < BLOCK_TOKENS:
            return
        if extends is not None and (adapter, extends.tokens) in self._entries:
            self._remove((adapter, extends.tokens))
        self._entries[key] = entry
        for h in block_hashes(adapter, entry.tokens, len(entry.tokens)):
            self._holders.setdefault(h, {})[key] = None
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._remove(next(iter(self._entries)))

    def _remove(self, key: _Key) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.nbytes
        for h in block_hashes(key[0], entry.tokens, len(entry.tokens)):
            holders = self._holders[h]
            del holders[key]
            if not holders:
                del self._holders[h]


def _common_prefix(stored: Sequence[int], tokens: Sequence[int], limit: int) -> int:
    """How many first tokens `stored` and `tokens` share, at most `limit`."""
    n, end = 0, min(len(stored), limit)
    while n < end and stored[n] == tokens[n]:
        n += 1
    return n


def weights_fingerprint(model: torch.nn.Module, adapters: Sequence[str]) -> Hashable:
    """Changes whenever a parameter of `model` is modified in place (its version counter moves: optimizer steps,
    ``copy_`` loads) or the set of adapters changes. Loads through ``.data`` bypass the counters: the sampler
    clears its cache on its own loads. Parameters made under inference mode have no version counter: then the
    fingerprint never repeats (nothing is reused)."""
    params = list(model.parameters())
    if any(p.is_inference() for p in params):
        return object()
    return sum(p._version for p in params), tuple(adapters)


@dataclass
class PrefillLayout:
    """Prompts laid out on top of their stored prefixes: input ids [B, S] and position ids [B, S] of the tokens
    still to prefill, attention mask [B, width + S] over the cached and the new positions. Rows are left-padded
    twice: a row's prefix ends at column `width` and its new tokens at column width + S; pads are masked out and
    positions count each row's real tokens."""

    input_ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    width: int


def prefill_layout(
    prompts: Sequence[Sequence[int]],
    prefixes: Sequence[CachedSequence | None],
    pad_id: int,
    device: torch.device,
    *,
    start: int = 0,
) -> PrefillLayout:
    """Lay `prompts` out on top of their `prefixes` (see `PrefillLayout`); `start`: the prompts' first token is
    at position `start` (what precedes them is attended to from elsewhere: a shared prefix)."""
    cached = [len(p.tokens) if p is not None else 0 for p in prefixes]
    suffixes = [list(prompt[n:]) for prompt, n in zip(prompts, cached)]
    width, length = max(cached), max(len(s) for s in suffixes)
    batch = len(prompts)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    mask = torch.zeros((batch, width + length), dtype=torch.long)
    positions = torch.zeros((batch, length), dtype=torch.long)
    for row, (suffix, n) in enumerate(zip(suffixes, cached)):
        input_ids[row, length - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
        mask[row, width - n : width] = 1
        mask[row, width + length - len(suffix) :] = 1
        positions[row, length - len(suffix) :] = torch.arange(start + n, start + n + len(suffix))
    return PrefillLayout(input_ids.to(device), mask.to(device), positions.to(device), width)


def write_prefixes(
    prefixes: Sequence[CachedSequence | None], width: int, keys: list[torch.Tensor], values: list[torch.Tensor]
) -> None:
    """Copy each row's prefix into columns [width - n, width) of per-layer [B, kv_heads, >= width, head_dim]
    `keys` and `values` (the other columns are left as they are)."""
    for row, prefix in enumerate(prefixes):
        if prefix is None or not prefix.tokens:
            continue
        start = width - len(prefix.tokens)
        for layer, (k, v) in enumerate(zip(prefix.keys, prefix.values)):
            keys[layer][row, :, start:width] = k
            values[layer][row, :, start:width] = v


def dynamic_cache(prefixes: Sequence[CachedSequence | None], width: int, config: Any) -> Any:
    """An HF `DynamicCache` holding the prefixes in `width` columns (zeros in the masked pads; empty for 0)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    if width:
        stored = next(p for p in prefixes if p is not None)
        keys = [k.new_zeros((len(prefixes), k.shape[0], width, k.shape[2])) for k in stored.keys]
        values = [v.new_zeros((len(prefixes), v.shape[0], width, v.shape[2])) for v in stored.values]
        write_prefixes(prefixes, width, keys, values)
        for layer, (k, v) in enumerate(zip(keys, values)):
            cache.update(k, v, layer)
    return cache


def reuses_prefixes(config: Any) -> bool:
    """Whether a model's cache is what prefix reuse stores: keys/values per position of full-attention layers (not
    sliding-window or linear-attention layers, nor a vision-language model's image positions)."""
    return full_attention_only(config) and not is_vision_language(config)
