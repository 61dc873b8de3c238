"""Seeded sampling with duplicate prompts, against every installed sampler (TorchSampler, vLLMSampler): identical
prompts in one seeded call draw different completions (a GRPO group sent as G copies of a prompt), while each
distinct prompt keeps the stream it has alone, whatever else is in the batch."""

from __future__ import annotations

import pytest

from tests.contract.implementations import build_sampler, installed
from twinkle_core.types import SamplingParams

PROMPT, OTHER = [5, 6, 7, 8, 9], [10, 11]
#: a temperature that flattens the random fixture's distributions: two copies sharing a stream would be equal,
#: two with their own streams differ (8 near-uniform draws over the vocabulary)
PARAMS = SamplingParams(max_tokens=8, temperature=2.0, seed=11)


@pytest.fixture(scope='module', params=installed('sampler'))
def sampler(request, tiny_model_dir):
    return build_sampler(request, request.param, tiny_model_dir)


def tokens(responses) -> list[tuple[int, ...]]:
    return [tuple(seq.tokens) for r in responses for seq in r.sequences]


def test_duplicate_prompts_of_one_seeded_call_draw_apart(sampler):
    batch = tokens(sampler.sample([PROMPT, OTHER, PROMPT, PROMPT], PARAMS))
    copies = [batch[0], batch[2], batch[3]]
    assert len(set(copies)) == 3, copies  # before: all three the same completion
    # the first copy and the distinct prompt keep the streams they have alone; later copies are reproducible too
    assert batch[0] == tokens(sampler.sample([PROMPT], PARAMS))[0]
    assert batch[1] == tokens(sampler.sample([OTHER], PARAMS))[0]
    assert copies == tokens(sampler.sample([PROMPT, PROMPT, PROMPT], PARAMS))
    other_seed = tokens(sampler.sample([PROMPT, PROMPT], PARAMS.model_copy(update={'seed': 12})))
    assert other_seed != copies[:2]
