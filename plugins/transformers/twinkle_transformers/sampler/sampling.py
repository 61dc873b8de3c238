"""Next-token selection for a batch of rows: temperature, top-k, top-p, per-row random streams.

Every row draws its randomness from its own `torch.Generator`, so a sequence's random stream depends only on its
seed -- not on which other rows share the batch, nor on rows finishing and leaving the batch early. Sampling uses
the exponential-race form of the categorical draw (``argmax(p / E)`` with ``E ~ Exp(1)``), which needs exactly
one noise vector per row and step and no Python-side branching on the distribution.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenChooser:
    """Sampling settings shared by every row of a batch. `top_k=-1` and `top_p=1.0` disable those filters;
    `temperature=0` is greedy (argmax, no randomness consumed)."""
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def choose(self, logits: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        """`logits` [B, V] (any float dtype) -> next token ids [B]. `generators[i]` drives row i."""
        if self.greedy:
            return logits.argmax(dim=-1)
        scores = logits.float() / self.temperature
        if 0 < self.top_k < scores.shape[-1]:
            kth_best = torch.topk(scores, self.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth_best, float('-inf'))
        probs = scores.softmax(dim=-1)
        if self.top_p < 1.0:
            probs = _top_p_filter(probs, self.top_p)
        noise = torch.stack([torch.empty(probs.shape[-1], device=probs.device).exponential_(generator=g)
                             for g in generators])
        return (probs / noise).argmax(dim=-1)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero out the tail of each row beyond the smallest prefix (by probability) whose mass reaches `top_p`.
    The most likely token is always kept."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] per row, in float32 -- the model's own (temperature-1) logprob of each token,
    i.e. exactly what a training forward computes for the same token."""
    logits = logits.float()
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(dim=-1)


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
