"""The batched decode loop: one prefill per distinct prompt, then token-by-token decoding over a KV cache.

Prompts are left-padded into one batch (2-D attention mask, position ids counted from each prompt's first real
token), prefilled once, and the cache is then fanned out to every sample of the prompt (prefix sharing: n samples
cost one prefill). Each step feeds only the newest token per row. Rows that stop leave the batch at once (their
cache rows are dropped), so a finished sequence costs nothing afterwards.

The loop talks to the model only through its Hugging Face forward (`input_ids`, `attention_mask`, `position_ids`,
`past_key_values`, `logits_to_keep`), so it works for any causal LM whose forward takes those arguments.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from twinkle_transformers.sampler.sampling import TokenChooser, chosen_logprobs
from twinkle_transformers.sampler.stopping import StopCondition, StopReason

# adapter name per batch row (None = base weights) -> (context, extra forward kwargs) running rows that way
Route = Callable[[list['str | None']], tuple[contextlib.AbstractContextManager[Any], dict[str, Any]]]


@dataclass
class PromptJob:
    """One prompt and the random streams of its samples (one generator per sample; empty when greedy)."""
    token_ids: list[int]
    generators: list[torch.Generator]
    num_samples: int
    adapter_name: str | None = None


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop_reason: StopReason = 'length'


@dataclass
class PromptResult:
    generations: list[Generation]
    prompt_logprobs: list[float | None] | None = None


class BatchDecoder:
    """Runs `decode` for a list of prompt jobs that fit in one batch. Stateless between calls."""

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, route: Route) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.route = route

    def _forward(self, adapters: list[str | None], **kwargs: Any) -> Any:
        context, extra = self.route(adapters)
        with context:
            return self.model(use_cache=True, **kwargs, **extra)

    @torch.inference_mode()
    def decode(self, jobs: list[PromptJob], chooser: TokenChooser, stop: StopCondition, *,
               prompt_logprobs: bool = False) -> list[PromptResult]:
        device = next(self.model.parameters()).device
        input_ids, mask, positions = _left_pad([j.token_ids for j in jobs], self.pad_token_id, device)
        prompt_len = input_ids.shape[1]
        prompt_adapters = [j.adapter_name for j in jobs]
        from transformers import DynamicCache
        cache = DynamicCache(config=getattr(self.model, 'config', None))
        out = self._forward(prompt_adapters, input_ids=input_ids, attention_mask=mask, position_ids=positions,
                            past_key_values=cache, logits_to_keep=0 if prompt_logprobs else 1)
        results = [PromptResult([Generation() for _ in range(j.num_samples)]) for j in jobs]
        if prompt_logprobs:
            for job, result, row in zip(jobs, results, _prompt_logprobs(out.logits, input_ids, jobs)):
                result.prompt_logprobs = row
        # Fan the prefilled prompts out to one row per sample.
        owner = [(p, s) for p, job in enumerate(jobs) for s in range(job.num_samples)]
        fan_out = torch.tensor([p for p, _ in owner], device=device)
        cache.batch_select_indices(fan_out)
        logits = out.logits[:, -1][fan_out]
        del out
        full_mask = torch.ones(len(owner), prompt_len + stop.max_tokens, dtype=mask.dtype, device=device)
        full_mask[:, :prompt_len] = mask[fan_out]
        next_pos = positions[fan_out, -1:] + 1
        generators = [jobs[p].generators[s] for p, s in owner] if not chooser.greedy else []
        adapters = [prompt_adapters[p] for p, _ in owner]
        live = list(range(len(owner)))  # rows of the current batch -> index into `owner`
        step = 0
        while True:
            tokens = chooser.choose(logits, generators)
            token_list = tokens.tolist()
            logprob_list = chosen_logprobs(logits, tokens).tolist()
            keep: list[int] = []
            for row, seq in enumerate(live):
                p, s = owner[seq]
                gen = results[p].generations[s]
                gen.tokens.append(token_list[row])
                gen.logprobs.append(logprob_list[row])
                reason = stop.check(gen.tokens)
                if reason is None:
                    keep.append(row)
                else:
                    gen.stop_reason = reason
            if not keep:
                return results
            if len(keep) < len(live):  # drop finished rows from every per-row tensor and the cache
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                tokens, full_mask, next_pos = tokens[index], full_mask[index], next_pos[index]
                live = [live[r] for r in keep]
                if generators:
                    generators = [generators[r] for r in keep]
                adapters = [adapters[r] for r in keep]
            step += 1
            logits = self._forward(adapters, input_ids=tokens.unsqueeze(-1), past_key_values=cache,
                                   attention_mask=full_mask[:, :prompt_len + step], position_ids=next_pos,
                                   logits_to_keep=1).logits[:, -1]
            next_pos = next_pos + 1


def _left_pad(prompts: list[list[int]], pad_id: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask [B, L] (left padding) and position_ids counted from each row's first token."""
    length = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for i, p in enumerate(prompts):
        input_ids[i, length - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, length - len(p):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids.to(device), mask.to(device), positions.to(device)


def _prompt_logprobs(logits: torch.Tensor, input_ids: torch.Tensor,
                     jobs: list[PromptJob]) -> list[list[float | None]]:
    """Per prompt: [None, log p(t1 | t0), log p(t2 | t0 t1), ...] from the prefill logits (left-padded rows)."""
    width = input_ids.shape[1]
    targets = input_ids[:, 1:]
    lps = chosen_logprobs(logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1)).view(targets.shape)
    rows = []
    for i, job in enumerate(jobs):
        n = len(job.token_ids)
        rows.append([None] + lps[i, width - n:].tolist())
    return rows
