"""Seeded sampling with duplicate prompts, against every installed sampler (TorchSampler, vLLMSampler): identical
prompts in one seeded call draw different completions (a GRPO group sent as G copies of a prompt), while each
distinct prompt keeps the stream it has alone, whatever else is in the batch."""

from __future__ import annotations

import pytest

from tests.contract.implementations import build_sampler, installed
from twinkle_core.errors import InvalidInputError
from twinkle_core.sampler.prompts import call_occurrences, prompt_occurrences
from twinkle_core.types import SamplingParams, Trajectory

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


def test_a_part_of_a_call_given_its_occurrences_draws_what_it_draws_in_the_whole_call(sampler):
    """A caller that splits one call over several samplers (a Ray sampler group over its ranks) passes each part the
    occurrences counted over the whole call: the part draws what those prompts draw in the whole call."""
    whole = tokens(sampler.sample([PROMPT, PROMPT, OTHER, PROMPT], PARAMS))
    assert tokens(sampler.sample([PROMPT], PARAMS, occurrences=[1]))[0] == whole[1] != whole[0]
    assert tokens(sampler.sample([OTHER, PROMPT], PARAMS, occurrences=[0, 2])) == whole[2:]
    assert tokens(sampler.sample([PROMPT], PARAMS, occurrences=None)) == whole[:1]  # None: counted in this call
    with pytest.raises(InvalidInputError, match='occurrences has 1 entries for 2 prompts'):
        sampler.sample([PROMPT, OTHER], PARAMS, occurrences=[0])


def test_a_call_counts_occurrences_as_its_samplers_do_before_encoding():
    """`call_occurrences` (what a splitting caller computes before any sampler encodes): token ids compare exactly,
    per adapter; Trajectories by their messages and tools, whatever their other fields."""
    chat = {'messages': [{'role': 'user', 'content': 'repeat 3'}], 'ground_truth': '3'}
    other_answer = {**chat, 'ground_truth': '4'}
    tools = {**chat, 'tools': [{'type': 'function', 'function': {'name': 'f'}}]}
    rows = [chat, Trajectory.model_validate(other_answer), tools, chat, {'input_ids': PROMPT}, PROMPT, {'bad': 1}]
    assert call_occurrences(rows, None) == [0, 1, 0, 2, 0, 1, 0]
    assert call_occurrences([PROMPT, PROMPT, PROMPT], ['a', None, 'a']) == [0, 0, 1]
    assert call_occurrences([PROMPT, PROMPT], None) == prompt_occurrences([PROMPT, PROMPT], [None, None])
