"""Shared-prefix attention in TorchSampler's lean decode: the first tokens every prompt of a batch shares are kept
once and read once per step, with the same tokens and log-probs as the plain Hugging Face decode."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from twinkle_core.types import SamplingParams
from twinkle_transformers.sampler import fast_decode
from twinkle_transformers.sampler.shared_prefix import MIN_SHARED_TOKENS, shared_length, shared_prefix_attention

SYSTEM = list(range(100, 140))  # a 40-token system prompt every prompt starts with
PROMPTS = [SYSTEM + [5 + i, 7, 9 + i] * (1 + i) for i in range(4)]  # tails of 3 to 12 tokens
STOP = list(range(40, 1185, 9))  # ids that end a turn: rows stop after different numbers of tokens


def sampler(model_dir, **kwargs):
    from twinkle_transformers.sampler import TorchSampler

    return TorchSampler(model_dir, device='cpu', **kwargs)


def assert_same(responses, reference):
    for got, want in zip(responses, reference, strict=True):
        for a, b in zip(got.sequences, want.sequences, strict=True):
            assert a.tokens == b.tokens
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


@pytest.fixture
def shared_calls(monkeypatch):
    """Counts the decode steps' shared-prefix attention calls (one per layer and step)."""
    calls = []
    real = fast_decode.shared_prefix_attention
    monkeypatch.setattr(fast_decode, 'shared_prefix_attention', lambda *a: calls.append(a[5][0].shape[1]) or real(*a))
    return calls


@pytest.mark.parametrize('prefix_cache_bytes', [0, None], ids=['no_prefix_cache', 'prefix_cache'])
def test_prompts_sharing_a_system_prompt_decode_as_without_sharing(tiny_model_dir, shared_calls, prefix_cache_bytes):
    cache = {} if prefix_cache_bytes is None else {'prefix_cache_bytes': prefix_cache_bytes}
    shared = sampler(tiny_model_dir, **cache)
    plain = sampler(tiny_model_dir, fast_decode=False, prefix_cache_bytes=0)
    for params in (
        SamplingParams(max_tokens=10, temperature=0.0, stop=STOP),
        SamplingParams(max_tokens=10, temperature=1.0, seed=3, num_samples=2, stop=STOP),
    ):
        shared_calls.clear()
        assert_same(shared.sample(PROMPTS, params), plain.sample(PROMPTS, params))
        assert shared_calls and set(shared_calls) == {len(SYSTEM)}  # the 40 shared tokens, kept once


def test_later_turns_take_the_shared_part_from_the_prefix_cache(tiny_model_dir, shared_calls):
    params = SamplingParams(max_tokens=8, temperature=0.0, stop=STOP)
    shared, plain = sampler(tiny_model_dir), sampler(tiny_model_dir, fast_decode=False, prefix_cache_bytes=0)
    prompts = PROMPTS
    for _ in range(3):  # each turn: the previous prompt + its sampled tokens + two inserted tokens
        got, want = shared.sample(prompts, params), plain.sample(prompts, params)
        assert_same(got, want)
        prompts = [p + list(r.sequences[0].tokens) + [21, 22 + i] for i, (p, r) in enumerate(zip(prompts, got))]
    assert set(shared_calls) == {len(SYSTEM)}
    # turns 2 and 3 extended the stored turns: the entries hold the shared part too (all but the last token)
    stats = shared.prefix_cache_stats
    assert stats['hits'] >= 2 * len(PROMPTS) and stats['reused_tokens'] > 2 * len(PROMPTS) * len(SYSTEM)


def test_one_prompt_or_a_short_common_part_is_not_shared(tiny_model_dir, shared_calls):
    s = sampler(tiny_model_dir)
    s.sample([PROMPTS[0]], SamplingParams(max_tokens=4, temperature=0.0))  # one row
    short = [list(range(100, 100 + MIN_SHARED_TOKENS - 1)) + [5 + i, 6] for i in range(3)]
    s.sample(short, SamplingParams(max_tokens=4, temperature=0.0))
    assert shared_calls == []
    s.sample([PROMPTS[0]], SamplingParams(max_tokens=4, temperature=0.0, num_samples=2))  # two rows of one prompt
    assert shared_calls and set(shared_calls) == {len(PROMPTS[0]) - 1}


def test_shared_length_rules():
    assert shared_length(PROMPTS, [None] * 4, rows=4) == len(SYSTEM)
    assert shared_length(PROMPTS, [None] * 4, rows=1) == 0  # nothing to share with
    assert shared_length(PROMPTS, ['a', 'b', 'a', 'a'], rows=4) == 0  # other weights, other keys
    assert shared_length([SYSTEM, SYSTEM + [1]], [None, None], rows=2) == len(SYSTEM) - 1  # one token left to prefill
    cut = MIN_SHARED_TOKENS - 1
    assert shared_length([SYSTEM[:cut] + [1], SYSTEM[:cut] + [2]], [None, None], rows=2) == 0


@pytest.mark.parametrize('batch, heads, kv_heads, count', [(3, 4, 2, 1), (2, 6, 2, 3), (2, 4, 4, 2)])
def test_shared_prefix_attention_equals_attention_over_the_concatenated_keys(batch, heads, kv_heads, count):
    g = torch.Generator().manual_seed(batch * 10 + count)
    prefix, own, dim = 7, 5, 8
    query = torch.randn(batch, heads, count, dim, generator=g)
    keys, values = (torch.randn(batch, kv_heads, own, dim, generator=g) for _ in range(2))
    shared_keys, shared_values = (torch.randn(kv_heads, prefix, dim, generator=g) for _ in range(2))
    mask = torch.rand(batch, 1, count, own, generator=g) > 0.4
    mask[..., -1] = True
    got = shared_prefix_attention(query, keys, values, mask, 0.3, (shared_keys, shared_values))
    all_keys = torch.cat([shared_keys.expand(batch, -1, -1, -1), keys], dim=2)
    all_values = torch.cat([shared_values.expand(batch, -1, -1, -1), values], dim=2)
    all_mask = torch.cat([torch.ones(batch, 1, count, prefix, dtype=torch.bool), mask], dim=-1)
    want = F.scaled_dot_product_attention(
        query, all_keys, all_values, attn_mask=all_mask, scale=0.3, enable_gqa=kv_heads != heads
    )
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
