"""A sampler hosted in a Ray group of several data ranks: one seeded call split across the ranks samples what the
same call samples in this process (identical prompts on different ranks draw apart, as they do in one sampler)."""

from __future__ import annotations

import pytest

import twinkle_core
from twinkle_core.mesh import DeviceGroup
from twinkle_core.registry import resolve_class
from twinkle_core.types import SamplingParams

pytest.importorskip('ray')

PROMPT, OTHER = [5, 6, 7, 8, 9], [10, 11]
#: flat distributions (see tests/contract/test_sampler_seeds.py): copies sharing a stream would be equal
PARAMS = SamplingParams(max_tokens=8, temperature=2.0, seed=11)


def tokens(responses) -> list[tuple[int, ...]]:
    return [tuple(seq.tokens) for r in responses for seq in r.sequences]


def test_a_call_split_over_two_ranks_samples_like_one_sampler(ray_cluster, tiny_model_dir) -> None:
    sampler_cls = resolve_class('sampler', 'TorchSampler')
    local = sampler_cls(model_id=str(tiny_model_dir), device='cpu')
    twinkle_core.initialize(mode='ray', groups=[DeviceGroup(name='sampler', ranks=2)])
    try:
        group = sampler_cls(model_id=str(tiny_model_dir), device='cpu', remote_group='sampler')
        copies = tokens(group.sample([PROMPT] * 4, PARAMS))  # ranks get [P, P] and [P, P]
        assert len(set(copies)) == 4, copies  # before: rank 1 drew rank 0's two completions again
        assert copies == tokens(local.sample([PROMPT] * 4, PARAMS))
        mixed = [PROMPT, OTHER, PROMPT, PROMPT]  # per-prompt adapter names are split with the prompts
        assert tokens(group.sample(mixed, PARAMS, adapter_name=[None] * 4)) == tokens(local.sample(mixed, PARAMS))
        # occurrences the caller counted over a larger call travel to the ranks as given
        given = tokens(group.sample([PROMPT, PROMPT], PARAMS, occurrences=[2, 3]))
        assert given == copies[2:]
    finally:
        twinkle_core.shutdown()
