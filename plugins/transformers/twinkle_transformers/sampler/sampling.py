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
        if 0 < self.top_k < scores.shape[-1]:  # work on the k best candidates only (already sorted)
            values, candidates = torch.topk(scores, self.top_k, dim=-1)
            probs = values.softmax(dim=-1)
            if self.top_p < 1.0:
                probs = _top_p_sorted(probs, self.top_p)
            pick = _race(probs, generators)
            return candidates.gather(-1, pick.unsqueeze(-1)).squeeze(-1)
        probs = scores.softmax(dim=-1)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            probs = torch.zeros_like(probs).scatter_(-1, order, _top_p_sorted(sorted_probs, self.top_p))
        return _race(probs, generators)


def _race(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One categorical draw per row: argmax(p / E), E ~ Exp(1) drawn from the row's own generator."""
    noise = torch.stack(
        [torch.empty(probs.shape[-1], device=probs.device).exponential_(generator=g) for g in generators]
    )
    return (probs / noise).argmax(dim=-1)


def _top_p_sorted(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of descending-sorted probabilities beyond the smallest prefix whose mass reaches `top_p`
    (the first token is always kept)."""
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    return sorted_probs.masked_fill(mass_before >= top_p, 0.0)


def chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] per row, in float32 -- the model's own (temperature-1) logprob of each token,
    i.e. exactly what a training forward computes for the same token."""
    logits = logits.float()
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(dim=-1)


def make_generator(seed: int, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen
