"""The units of a decode: a prompt job (one prompt, its samples' random streams), what to score at the prompt's
positions, the results, and a prompt's `SampleResponse` made of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from twinkle_core.sampler.prompts import IMAGE_FIELDS, sampled_sequence
from twinkle_core.types import SampleResponse, SamplingParams
from twinkle_transformers.sampler.stopping import StopReason
from twinkle_transformers.sampler.vision_inputs import PromptImages


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


def sample_response(
    row: Any,
    encoded: dict[str, Any],
    parts: list[PromptResult],
    params: SamplingParams,
    decode: Callable[[list[int]], str | None],
) -> SampleResponse:
    """A prompt's `SampleResponse` from the results of its jobs (`parts`: one, or several when its samples were
    split over batches; the scored one carries the prompt's scores); `decode`: token ids -> text."""
    images = {k: encoded[k] for k in IMAGE_FIELDS if k in encoded} or None
    sequences = [
        sampled_sequence(
            params,
            row,
            encoded['input_ids'],
            gen.tokens,
            gen.logprobs,
            gen.top_logprobs or None,
            gen.stop_reason,
            decode(gen.tokens),
            images,
        )
        for part in parts
        for gen in part.generations
    ]
    scored = next((part for part in parts if part.scored), parts[0])
    return SampleResponse(
        sequences=sequences,
        prompt_logprobs=scored.prompt_logprobs,
        prompt_top_logprobs=scored.prompt_top_logprobs,
        prompt_target_logprobs=scored.prompt_target_logprobs,
        prompt_alt_tokens=scored.prompt_alt_tokens,
    )
