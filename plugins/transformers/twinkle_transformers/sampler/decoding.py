"""The batched decode loop: one prefill per distinct prompt, then token-by-token decoding over a KV cache.

Prompts are left-padded into one batch (2-D attention mask, position ids counted from each prompt's first real
token) and prefilled once with the model's Hugging Face forward; the cache is then fanned out to every sample of
the prompt (prefix sharing: n samples, or n equal prompts, cost one prefill). With a `PrefixCache`, a prompt that
starts with a sequence an earlier call computed prefills only its remaining tokens (`prefix_cache.py`). First
tokens that all prompts share (a system prompt, tool schemas) are kept once and read once per step on the lean
path (`shared_prefix.py`).

Each step feeds only the newest token per row. Rows that stop leave the batch at once (their cache rows are
dropped), so a finished sequence costs nothing afterwards. A prompt whose `halt` predicate turns true (its
request was cancelled) is stopped the same way at the next step; one halted before the batch starts is never
prefilled.

Decode steps run through `FastDecoder` (a lean Llama-family step over a preallocated cache) when the model
supports it, otherwise through the HF forward with `past_key_values` -- any causal LM whose forward takes
`input_ids`, `attention_mask`, `position_ids`, `past_key_values` and `logits_to_keep` works.

Vision-language models (``vision_language=True``) take the HF path: the prefill also gets the image prompts'
images and ``[4, B, L]`` M-RoPE positions, and every step ``[4, B, 1]`` positions continuing them
(`vision_inputs.py`); their image/video placeholder tokens are never sampled (they still count in the
log-softmax, so log-probs stay the model's own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from twinkle_transformers.sampler.fast_decode import FastDecoder, StaticKVCache
from twinkle_transformers.sampler.jobs import Generation, PromptJob, PromptResult, PromptScoring
from twinkle_transformers.sampler.prefix_cache import (
    CachedSequence,
    PrefillLayout,
    PrefixCache,
    dynamic_cache,
    prefill_layout,
    write_prefixes,
)
from twinkle_transformers.sampler.prompt_scoring import score_prompt
from twinkle_transformers.sampler.sampling import TokenChooser, chosen_logprobs
from twinkle_transformers.sampler.shared_prefix import SharedPrefix, shared_length
from twinkle_transformers.sampler.steppers import FastStepper, HFStepper, Route, Stepper
from twinkle_transformers.sampler.stopping import StopCondition
from twinkle_transformers.sampler.vision_inputs import (
    placeholder_token_ids,
    prefill_inputs,
    step_positions,
)


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
        self.prefix_cache = prefix_cache
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
        halt: Callable[[int], bool] | None = None,
    ) -> list[PromptResult]:
        """One `PromptResult` per job. `halt(job index)`, asked before the prefill and once per decode step
        while the job has rows decoding: True stops that job's rows now, as if finished (`stop_reason` 'length',
        not kept in the prefix cache); a job halted before the prefill is not decoded (empty generations)."""
        if halt is not None:
            asked = halt
            active = [p for p in range(len(jobs)) if not asked(p)]
            if len(active) < len(jobs):  # decode the others only
                results = [PromptResult([Generation() for _ in range(j.num_samples)]) for j in jobs]
                if active:
                    decoded = self.decode(
                        [jobs[p] for p in active],
                        chooser,
                        stop,
                        scoring=scoring,
                        top_logprobs=top_logprobs,
                        halt=lambda q: asked(active[q]),
                    )
                    for p, result in zip(active, decoded):
                        results[p] = result
                return results
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
        share = self._shared_length(unique, sum(j.num_samples for j in jobs), scoring)
        shared = self._shared_prefix(unique[0], prefixes, share) if share else None
        row_prefixes = [p.after(share) if p is not None else None for p in prefixes]
        layout = prefill_layout(
            [j.token_ids[share:] for j in unique], row_prefixes, self.pad_token_id, device, start=share
        )
        capacity = layout.mask.shape[1] + stop.max_tokens  # cached, new and generated positions (after `share`)
        results = [PromptResult([Generation() for _ in range(j.num_samples)]) for j in jobs]
        last_logits, cache, deltas = self._prefill(unique, row_prefixes, layout, capacity, scoring, shared)
        if scoring.active:
            for p, (job, result) in enumerate(zip(jobs, results)):
                if job.scored:
                    score_prompt(last_logits[prefill_row[p]], job, scoring, result)
        last_logits = last_logits[:, -1]
        # Fan the prefilled prompts out to one row per sample.
        owner = [(p, s) for p, job in enumerate(jobs) for s in range(job.num_samples)]
        fan_rows = [prefill_row[p] for p, _ in owner]
        fan_out = torch.tensor(fan_rows, device=device)
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
        stepper = self._stepper(cache, fan_out, key_mask, fanned=fan_rows != list(range(len(unique))))
        banned = torch.tensor(self.never_sampled, device=device) if self.never_sampled else None
        while True:
            tokens = chooser.choose(
                logits if banned is None else logits.index_fill(-1, banned, float('-inf')), rows.generators
            )
            token_list = tokens.tolist()
            logprob_list = chosen_logprobs(logits, tokens).tolist()
            top = _top_logprobs(logits, top_logprobs) if top_logprobs else None
            halted = _halted(halt, {owner[seq][0] for seq in rows.live})
            keep: list[int] = []
            for row, seq in enumerate(rows.live):
                p, s = owner[seq]
                gen = results[p].generations[s]
                gen.tokens.append(token_list[row])
                gen.logprobs.append(logprob_list[row])
                if top is not None:
                    gen.top_logprobs.append(top[row])
                reason = stop.check(gen.tokens)
                if reason is None and p not in halted:
                    keep.append(row)
                elif reason is None:  # halted: cut here, like a sequence out of tokens (the caller discards it)
                    gen.stop_reason = 'length'
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

    def _shared_length(self, unique: list[PromptJob], rows: int, scoring: PromptScoring) -> int:
        """First prompt tokens kept once for all rows (`shared_prefix.py`): lean steps only, never when scoring."""
        if self.fast is None or scoring.active:
            return 0
        return shared_length([j.token_ids for j in unique], [j.adapter_name for j in unique], rows)

    def _prefill(
        self,
        unique: list[PromptJob],
        prefixes: list[CachedSequence | None],
        layout: PrefillLayout,
        capacity: int,
        scoring: PromptScoring,
        shared: SharedPrefix | None = None,
    ) -> tuple[torch.Tensor, Any, torch.Tensor | None]:
        """Prefill the distinct prompts on top of their prefixes: logits [U, W, V] (the last W positions: 1, or the
        scored ones), the cache (a `StaticKVCache` of `capacity` positions from the lean step, else an HF
        `DynamicCache`) and the M-RoPE deltas of a vision-language model. `shared` (lean step only): the first
        positions every prompt starts with, kept once (`layout` and `prefixes` hold what follows them)."""
        if self.fast is not None and not scoring.active:  # the lean step prefills too: no HF cache to convert
            self.fast.prepare(positions=(shared.length if shared is not None else 0) + capacity + 1)
            static = self.fast.new_cache(len(unique), capacity)
            static.shared = shared
            write_prefixes(prefixes, layout.width, static.keys, static.values)
            static.length = layout.width
            with self.route([j.adapter_name for j in unique])[0]:
                logits = self.fast.step(layout.input_ids, layout.positions, static, layout.mask.bool())
            return logits[:, None], static, None
        inputs: dict[str, Any] = {'position_ids': layout.positions}
        deltas = None
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
        return out.logits, cache, deltas

    def _shared_prefix(self, job: PromptJob, prefixes: list[CachedSequence | None], share: int) -> SharedPrefix:
        """The keys/values of `job`'s first `share` tokens (which every prompt of the batch starts with): from a
        stored prefix that covers them, else one single-row prefill."""
        assert self.fast is not None
        stored = next((p for p in prefixes if p is not None and len(p.tokens) >= share), None)
        if stored is not None:
            part = stored.first(share)
            return SharedPrefix([k.contiguous() for k in part.keys], [v.contiguous() for v in part.values])
        device = next(self.model.parameters()).device
        self.fast.prepare(positions=share)
        cache = self.fast.new_cache(1, share)
        with self.route([job.adapter_name])[0]:
            self.fast.step(
                torch.tensor([job.token_ids[:share]], device=device),
                torch.arange(share, device=device)[None],
                cache,
                torch.ones(1, share, dtype=torch.bool, device=device),
            )
        return SharedPrefix([k[0] for k in cache.keys], [v[0] for v in cache.values])

    def _stepper(self, cache: Any, fan_out: torch.Tensor, key_mask: torch.Tensor, *, fanned: bool) -> Stepper:
        """The decode steps over the prefilled cache, fanned out to one row per sample (`fanned`: not one to one)."""
        if self.fast is None:
            return HFStepper(self._forward, cache, fan_out, key_mask)
        if not isinstance(cache, StaticKVCache):  # an HF prefill (scored prompts)
            self.fast.prepare(positions=key_mask.shape[1] + 1)
            cache = StaticKVCache.from_dynamic(cache, fan_out, key_mask.shape[1])
        elif fanned:
            cache.select(fan_out)
        return FastStepper(self.fast, cache, key_mask, self.route)

    def _remember(
        self, stepper: Stepper, row: int, job: PromptJob, gen: Generation, prefix: CachedSequence | None
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


def _halted(halt: Callable[[int], bool] | None, jobs: set[int]) -> set[int]:
    """The jobs among `jobs` (those with rows still decoding) whose `halt` says stop now."""
    return set() if halt is None else {p for p in jobs if halt(p)}


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
