"""Scores at a prompt's positions from the prefill logits: log-probs, top-k, target ids' log-probs, draws."""

from __future__ import annotations

import torch

from twinkle_core.sampler.prompts import first_scored
from twinkle_transformers.sampler.jobs import PromptJob, PromptResult, PromptScoring

#: float32 logits scored at once (bounds the memory of scoring a long prompt over a large vocabulary: 128 MiB)
SCORE_CHUNK_ELEMENTS = 1 << 25


def score_prompt(logits: torch.Tensor, job: PromptJob, scoring: PromptScoring, result: PromptResult) -> None:
    """Fill `result`'s prompt_* fields from one left-padded row's prefill logits [W, V] (the last W positions of
    the batch: position p of a prompt of length L is predicted by row ``W - L + p - 1``). Positions are scored in
    chunks of at most `SCORE_CHUNK_ELEMENTS` logits."""
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
