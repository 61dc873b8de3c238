"""The batched decode loop: one prefill per distinct prompt, then token-by-token decoding over a KV cache.

Prompts are left-padded into one batch (2-D attention mask, position ids counted from each prompt's first real
token) and prefilled once with the model's Hugging Face forward; the cache is then fanned out to every sample of
the prompt (prefix sharing: n samples, or n equal prompts, cost one prefill). With a `PrefixCache`, a prompt that
starts with a sequence an earlier call computed prefills only its remaining tokens (`prefix_cache.py`).

Each step feeds only the newest token per row. Rows that stop leave the batch at once (their cache rows are
dropped), so a finished sequence costs nothing afterwards.

Decode steps run through `FastDecoder` (a lean Llama-family step over a preallocated cache) when the model
supports it, otherwise through the HF forward with `past_key_values` -- any causal LM whose forward takes
`input_ids`, `attention_mask`, `position_ids`, `past_key_values` and `logits_to_keep` works.

Vision-language models (``vision_language=True``) take the HF path: the prefill also gets the image prompts'
images and ``[4, B, L]`` M-RoPE positions, and every step ``[4, B, 1]`` positions continuing them
(`vision_inputs.py`); their image/video placeholder tokens are never sampled (they still count in the
log-softmax, so log-probs stay the model's own).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from twinkle_transformers.sampler.fast_decode import FastDecoder, StaticKVCache
from twinkle_transformers.sampler.prefix_cache import (
    CachedSequence,
    PrefixCache,
    dynamic_cache,
    prefill_layout,
    write_prefixes,
)
from twinkle_transformers.sampler.sampling import TokenChooser, chosen_logprobs
from twinkle_transformers.sampler.stopping import StopCondition, StopReason
from twinkle_transformers.sampler.vision_inputs import (
    PromptImages,
    placeholder_token_ids,
    prefill_inputs,
    step_positions,
)

# adapter name per batch row (None = base weights) -> (context, extra forward kwargs) running rows that way
Route = Callable[[list['str | None']], tuple[contextlib.AbstractContextManager[Any], dict[str, Any]]]


@dataclass
class PromptJob:
    """One prompt and the random streams of its samples (one generator per sample; empty when greedy);
    `images`: an image prompt's images (vision-language models only); `scored`: this job returns the prompt's
    scores (`PromptScoring`; False for the further parts of a prompt split over batches); `draws`: the random
    stream of its `prompt_alt_tokens` draws."""

    token_ids: list[int]
    generators: list[torch.Generator]
    num_samples: int
    adapter_name: str | None = None
    images: PromptImages | None = None
    scored: bool = True
    draws: torch.Generator | None = None


@dataclass(frozen=True)
class PromptScoring:
    """What to compute at the prompt's positions from the prefill (`SamplingParams`' prompt_* fields): the prompt
    tokens' log-probs, the `top_k` most likely, both from position `first_scored(len, last_n)` on; log-probs of the
    `targets` ids (row i: position i + 1, -1 = none); `alt_k` draws at `alt_temperature` per position. Log-probs
    are the raw model's (float32 log-softmax of the logits)."""

    logprobs: bool = False
    top_k: int = 0
    last_n: int | None = None
    targets: list[list[int]] | None = None
    alt_k: int = 0
    alt_temperature: float = 1.0

    @property
    def active(self) -> bool:
        return self.logprobs or self.top_k > 0 or self.targets is not None or self.alt_k > 0

    def logits_to_keep(self) -> int:
        """Prefill logits to keep: the last one (nothing scored), the last ``last_n + 1`` (only a suffix scored: the
        prompts are left-padded, so a row's last positions are its own), or all (0)."""
        if not self.active:
            return 1
        if self.targets is None and not self.alt_k and self.last_n is not None:
            return self.last_n + 1
        return 0


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    stop_reason: StopReason = 'length'


@dataclass
class PromptResult:
    generations: list[Generation]
    scored: bool = False  # the prompt_* fields below were computed by this part
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None
    prompt_target_logprobs: list[list[float]] | None = None
    prompt_alt_tokens: list[list[tuple[int, float]]] | None = None


class BatchDecoder:
    """Runs `decode` for a list of prompt jobs that fit in one batch. Stateless between calls but for
    `prefix_cache` (`prefix_cache.py`): prompts that extend a stored sequence prefill only their new tokens, and
    every finished sequence is stored. `vision_language`: the model is a VL model (images and M-RoPE positions;
    never the fast path; no prefix cache)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        pad_token_id: int,
        route: Route,
        fast: FastDecoder | None = None,
        vision_language: bool = False,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.model = model
        self.prefix_cache = prefix_cache if prefix_cache is not None and prefix_cache.enabled else None
        self.pad_token_id = pad_token_id
        self.route = route
        self.fast = None if vision_language else fast
        self.vision_language = vision_language
        self.never_sampled = placeholder_token_ids(getattr(model, 'config', None)) if vision_language else []

    def _forward(self, adapters: list[str | None], **kwargs: Any) -> Any:
        context, extra = self.route(adapters)
        with context:
            return self.model(use_cache=True, **kwargs, **extra)

    @torch.inference_mode()
    def decode(
        self,
        jobs: list[PromptJob],
        chooser: TokenChooser,
        stop: StopCondition,
        *,
        scoring: PromptScoring = PromptScoring(),
        top_logprobs: int = 0,
    ) -> list[PromptResult]:
        if not self.vision_language and any(j.images is not None for j in jobs):
            raise ValueError('image prompts need vision_language=True')  # TorchSampler refuses them earlier
        device = next(self.model.parameters()).device
        distinct, prefill_row = _distinct_prompts(jobs)
        unique = [jobs[p] for p in distinct]
        cache_lookup = None if scoring.active else self.prefix_cache  # scoring needs every prompt position's logits
        prefixes = [
            cache_lookup.longest_prefix(j.adapter_name, j.token_ids) if cache_lookup is not None else None
            for j in unique
        ]
        layout = prefill_layout([j.token_ids for j in unique], prefixes, self.pad_token_id, device)
        capacity = layout.mask.shape[1] + stop.max_tokens  # cached, new and generated positions
        results = [PromptResult([Generation() for _ in range(j.num_samples)]) for j in jobs]
        deltas = None
        if self.fast is not None and not scoring.active:  # the lean step prefills too: no HF cache to convert
            self.fast.prepare(positions=capacity + 1)
            static = self.fast.new_cache(len(unique), capacity)
            write_prefixes(prefixes, layout.width, static.keys, static.values)
            static.length = layout.width
            with self.route([j.adapter_name for j in unique])[0]:
                last_logits = self.fast.step(layout.input_ids, layout.positions, static, layout.mask.bool())
            cache: Any = static
        else:
            inputs: dict[str, Any] = {'position_ids': layout.positions}
            if self.vision_language:
                inputs, deltas = prefill_inputs(
                    self.model, [j.token_ids for j in unique], [j.images for j in unique], layout.positions
                )
            cache = dynamic_cache(prefixes, layout.width, getattr(self.model, 'config', None))
            out = self._forward(
                [j.adapter_name for j in unique],
                input_ids=layout.input_ids,
                attention_mask=layout.mask,
                past_key_values=cache,
                logits_to_keep=scoring.logits_to_keep(),
                **inputs,
            )
            if scoring.active:
                for p, (job, result) in enumerate(zip(jobs, results)):
                    if job.scored:
                        _score_prompt(out.logits[prefill_row[p]], job, scoring, result)
            last_logits = out.logits[:, -1]
            del out
        # Fan the prefilled prompts out to one row per sample.
        owner = [(p, s) for p, job in enumerate(jobs) for s in range(job.num_samples)]
        fan_out = torch.tensor([prefill_row[p] for p, _ in owner], device=device)
        logits = last_logits[fan_out]
        key_mask = torch.ones(len(owner), capacity, dtype=layout.mask.dtype, device=device)
        key_mask[:, : layout.mask.shape[1]] = layout.mask[fan_out]
        rows = _Rows(
            adapters=[jobs[p].adapter_name for p, _ in owner],
            generators=[jobs[p].generators[s] for p, s in owner] if not chooser.greedy else [],
            next_pos=layout.positions[fan_out, -1:] + 1,
            live=list(range(len(owner))),
            deltas=deltas[fan_out] if deltas is not None else None,
        )
        stepper: _Stepper
        if self.fast is None:
            stepper = _HFStepper(self, cache, fan_out, key_mask)
        else:
            if isinstance(cache, StaticKVCache):
                if len(owner) != len(unique) or prefill_row != list(range(len(unique))):
                    cache.select(fan_out)
            else:
                self.fast.prepare(positions=capacity + 1)
                cache = StaticKVCache.from_dynamic(cache, fan_out, capacity)
            stepper = _FastStepper(self.fast, cache, key_mask, self.route)
        banned = torch.tensor(self.never_sampled, device=device) if self.never_sampled else None
        while True:
            tokens = chooser.choose(
                logits if banned is None else logits.index_fill(-1, banned, float('-inf')), rows.generators
            )
            token_list = tokens.tolist()
            logprob_list = chosen_logprobs(logits, tokens).tolist()
            top = _top_logprobs(logits, top_logprobs) if top_logprobs else None
            keep: list[int] = []
            for row, seq in enumerate(rows.live):
                p, s = owner[seq]
                gen = results[p].generations[s]
                gen.tokens.append(token_list[row])
                gen.logprobs.append(logprob_list[row])
                if top is not None:
                    gen.top_logprobs.append(top[row])
                reason = stop.check(gen.tokens)
                if reason is None:
                    keep.append(row)
                else:
                    gen.stop_reason = reason
                    self._remember(stepper, row, jobs[p], gen, prefixes[prefill_row[p]])
            if not keep:
                return results
            if len(keep) < len(rows.live):  # drop finished rows from every per-row tensor and the cache
                index = torch.tensor(keep, device=device)
                tokens = tokens[index]
                rows.select(keep, index)
                stepper.select(index)
            logits = stepper(tokens, rows.positions(), rows.adapters)
            rows.next_pos = rows.next_pos + 1

    def _remember(
        self, stepper: _Stepper, row: int, job: PromptJob, gen: Generation, prefix: CachedSequence | None
    ) -> None:
        """Store a finished row's keys/values in the prefix cache: the prompt and every sampled token but the
        last (never fed back)."""
        if self.prefix_cache is None:
            return
        tokens = (*job.token_ids, *gen.tokens[:-1])
        keys, values = stepper.row_cache(row)
        if keys[0].shape[1] == len(tokens):  # always, unless a model's cache holds something else
            self.prefix_cache.store(job.adapter_name, CachedSequence(tokens, keys, values), extends=prefix)


def _distinct_prompts(jobs: list[PromptJob]) -> tuple[list[int], list[int]]:
    """The jobs to prefill (the first of each set of equal text prompts under one adapter: their samples share
    one prefill) and, per job, its row among them. Image prompts are prefilled each."""
    distinct: list[int] = []
    prefill_row: list[int] = []
    seen: dict[tuple[str | None, tuple[int, ...]], int] = {}
    for index, job in enumerate(jobs):
        key = (job.adapter_name, tuple(job.token_ids))
        row = seen.get(key) if job.images is None else None
        if row is None:
            row = len(distinct)
            distinct.append(index)
            if job.images is None:
                seen[key] = row
        prefill_row.append(row)
    return distinct, prefill_row


def _top_logprobs(logits: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """Per row, the `k` most likely (token, log p) pairs (raw model, float32), most likely first."""
    values, indices = logits.float().log_softmax(-1).topk(min(k, logits.shape[-1]), dim=-1)
    return [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]


@dataclass
class _Rows:
    """Per-row decode state of the current batch (rows shrink as sequences finish)."""

    adapters: list[str | None]
    generators: list[torch.Generator]
    next_pos: torch.Tensor
    live: list[int]  # batch row -> sequence index
    deltas: torch.Tensor | None = None  # M-RoPE delta per row [B, 1] (vision-language models only)

    def positions(self) -> torch.Tensor:
        """Position ids of the next step: [B, 1], or [4, B, 1] on a vision-language model."""
        return self.next_pos if self.deltas is None else step_positions(self.next_pos, self.deltas)

    def select(self, keep: list[int], index: torch.Tensor) -> None:
        self.adapters = [self.adapters[r] for r in keep]
        self.generators = [self.generators[r] for r in keep] if self.generators else []
        self.next_pos = self.next_pos[index]
        self.live = [self.live[r] for r in keep]
        self.deltas = self.deltas[index] if self.deltas is not None else None


class _Stepper(Protocol):
    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, adapters: list[str | None]) -> torch.Tensor:
        """Logits [B, V] for the next token of each row."""

    def select(self, index: torch.Tensor) -> None:
        """Keep only these batch rows."""

    def row_cache(self, row: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One row's cached keys and values per layer [kv_heads, n, head_dim], its n unmasked positions only."""


class _HFStepper:
    """Decode steps through the model's own forward and a growing `DynamicCache`. Rows are picked with the cache's
    `reorder_cache` (an index select of every layer's state: keys/values, and the conv/recurrent states of
    linear-attention layers, which have no `batch_select_indices`)."""

    def __init__(self, decoder: BatchDecoder, cache: Any, fan_out: torch.Tensor, key_mask: torch.Tensor) -> None:
        cache.reorder_cache(fan_out)
        self.decoder, self.cache, self.key_mask = decoder, cache, key_mask
        self.length = cache.get_seq_length()

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, adapters: list[str | None]) -> torch.Tensor:
        self.length += 1
        return self.decoder._forward(
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


class _FastStepper:
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
        length = self.cache.length
        row = row if self.live is None else int(self.live[row])
        valid = self.key_mask[row, :length]
        return (
            [k[row, :, :length][:, valid] for k in self.cache.keys],
            [v[row, :, :length][:, valid] for v in self.cache.values],
        )


#: float32 logits scored at once (bounds the memory of scoring a long prompt over a large vocabulary: 128 MiB)
SCORE_CHUNK_ELEMENTS = 1 << 25


def _score_prompt(logits: torch.Tensor, job: PromptJob, scoring: PromptScoring, result: PromptResult) -> None:
    """Fill `result`'s prompt_* fields from one left-padded row's prefill logits [W, V] (the last W positions of
    the batch: position p of a prompt of length L is predicted by row ``W - L + p - 1``). Positions are scored in
    chunks of at most `SCORE_CHUNK_ELEMENTS` logits."""
    from twinkle_core.sampler.prompts import first_scored

    ids = job.token_ids
    length, width, vocab = len(ids), logits.shape[0], logits.shape[-1]
    first = first_scored(length, scoring.last_n) if scoring.logprobs or scoring.top_k else length
    # the positions every output needs: targets and draws cover 1..L-1, the others first..L-1
    start = 1 if scoring.targets is not None or scoring.alt_k else first
    offset = width - length - 1  # row of position p = offset + p
    tokens = torch.tensor(ids, device=logits.device)
    chosen: list[float] = []
    top: list[list[tuple[int, float]]] = []
    target_lps: list[list[float]] = []
    draws: list[list[tuple[int, float]]] = []
    step = max(1, SCORE_CHUNK_ELEMENTS // vocab)
    for lo in range(start, length, step):
        hi = min(lo + step, length)  # positions lo..hi-1
        rows = logits[offset + lo : offset + hi].float()
        norm = rows.logsumexp(-1, keepdim=True)
        s = max(first, lo) - lo  # rows of this chunk from the first scored position on
        if scoring.logprobs and s < hi - lo:
            chosen += (rows[s:].gather(-1, tokens[max(first, lo) : hi, None]) - norm[s:])[:, 0].tolist()
        if scoring.top_k and s < hi - lo:
            values, indices = rows[s:].topk(min(scoring.top_k, vocab), dim=-1)
            top += [list(zip(i, v)) for i, v in zip(indices.tolist(), (values - norm[s:]).tolist())]
        if scoring.targets is not None:
            asked = torch.tensor(scoring.targets[lo - 1 : hi - 1], dtype=torch.long, device=logits.device)
            if asked.numel():
                lps = (rows.gather(-1, asked.clamp(min=0)) - norm).masked_fill(asked < 0, 0.0)
                target_lps += lps.tolist()
            else:
                target_lps += [[] for _ in range(hi - lo)]
        if scoring.alt_k:
            if scoring.alt_temperature == 0.0:
                picked = rows.argmax(-1, keepdim=True).expand(-1, scoring.alt_k)
            else:
                probs = (rows / scoring.alt_temperature).softmax(-1)
                picked = torch.multinomial(probs, scoring.alt_k, replacement=True, generator=job.draws)
            lps = rows.gather(-1, picked) - norm
            draws += [list(zip(t, v)) for t, v in zip(picked.tolist(), lps.tolist())]
    blank: list[None] = [None] * first
    if scoring.logprobs:
        result.prompt_logprobs = [*blank, *chosen]
    if scoring.top_k:
        result.prompt_top_logprobs = [*blank, *top]
    if scoring.targets is not None:
        result.prompt_target_logprobs = target_lps
    if scoring.alt_k:
        result.prompt_alt_tokens = draws
    result.scored = True
