"""Sample jobs (one per prompt, with its random streams), grouped into decode batches; eval mode for a (possibly
shared, training) model."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

import torch

from twinkle_core.sampler.prompts import prompt_draw_seed, sequence_seed
from twinkle_core.types import SamplingParams
from twinkle_transformers.sampler.jobs import PromptJob
from twinkle_transformers.sampler.sampling import make_generator
from twinkle_transformers.sampler.vision_inputs import PromptImages


def prompt_jobs(
    prompts: list[list[int]],
    adapters: list[str | None],
    params: SamplingParams,
    device: torch.device,
    greedy: bool,
    images: list[PromptImages | None],
    occurrences: list[int],
) -> list[tuple[int, PromptJob]]:
    """(prompt index, job) pairs; a prompt gets one generator per sample (see `sequence_seed`: identical prompts of
    the call are told apart by their `occurrences`, from `resolve_occurrences`)."""
    jobs = []
    for i, (ids, adapter, image, nth) in enumerate(zip(prompts, adapters, images, occurrences)):
        base_seed = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
        generators = (
            []
            if greedy
            else [make_generator(sequence_seed(base_seed, s, ids, nth), device) for s in range(params.num_samples)]
        )
        draws = (
            make_generator(prompt_draw_seed(base_seed, ids, nth), device)
            if params.prompt_alt_tokens and not greedy
            else None
        )
        jobs.append((i, PromptJob(ids, generators, params.num_samples, adapter, image, draws=draws)))
    return jobs


def decode_batches(
    jobs: list[tuple[int, PromptJob]], max_sequences: int, *, by_adapter: bool = False
) -> Iterator[list[tuple[int, PromptJob]]]:
    """Group jobs (shortest prompts together, to limit padding) into batches of at most `max_sequences`
    sequences; a prompt with more samples than that is split into several jobs. `by_adapter`: each batch holds
    the jobs of one adapter only."""
    if by_adapter:
        groups: dict[str | None, list[tuple[int, PromptJob]]] = {}
        for item in jobs:
            groups.setdefault(item[1].adapter_name, []).append(item)
        for group in groups.values():
            yield from decode_batches(group, max_sequences)
        return
    split: list[tuple[int, PromptJob]] = []
    for index, job in jobs:
        for start in range(0, job.num_samples, max_sequences):
            count = min(max_sequences, job.num_samples - start)
            part = dataclasses.replace(
                job, generators=job.generators[start : start + count], num_samples=count, scored=start == 0
            )
            split.append((index, part))
    split.sort(key=lambda item: len(item[1].token_ids))
    batch: list[tuple[int, PromptJob]] = []
    size = 0
    for item in split:
        if batch and size + item[1].num_samples > max_sequences:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item[1].num_samples
    if batch:
        yield batch


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run in eval mode (no dropout), then restore exactly the modules that were training (a shared model may
    belong to a trainer)."""
    training = [m for m in model.modules() if m.training]
    model.eval()
    try:
        yield
    finally:
        for m in training:
            m.training = True
