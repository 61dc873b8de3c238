"""TorchSampler's prefix cache: a prompt that extends an earlier call's sequence (the next turn of an episode)
prefills only its new tokens, with the same tokens and log-probs as a sampler without the cache; entries follow
the weights and the adapter; the budget holds; equal prompts in one call share a prefill and draw apart."""

from __future__ import annotations

import pytest
import torch

from tests.contract.test_sampler_contract import peft_adapter
from twinkle_core.errors import InvalidInputError
from twinkle_core.types import SamplingParams
from twinkle_transformers.sampler.prefix_cache import BLOCK_TOKENS, CachedSequence, PrefixCache, weights_fingerprint

FIRST_TURNS = [[5 + i, 7, 9, 11 + i] * (5 + i) for i in range(5)]
STOP = list(range(40, 1185, 9))  # ids that end a turn: rows stop after different numbers of tokens


def sampler(model_dir, **kwargs):
    from twinkle_transformers.sampler import TorchSampler

    return TorchSampler(model_dir, device='cpu', **kwargs)


def two_turns(s, params: SamplingParams, adapter=None):
    """Turn 1, then turn 2 on each turn-1 sequence plus a few inserted tokens (as a multi-turn rollout does)."""
    first = s.sample(FIRST_TURNS, params, adapter_name=adapter)
    second_prompts = [
        p + list(r.sequences[0].tokens) + [21, 22 + i] for i, (p, r) in enumerate(zip(FIRST_TURNS, first))
    ]
    return first, s.sample(second_prompts, params, adapter_name=adapter)


def assert_same(responses, reference):
    for got, want in zip(responses, reference, strict=True):
        for a, b in zip(got.sequences, want.sequences, strict=True):
            assert a.tokens == b.tokens
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize('fast_decode', [True, False], ids=['fast_decode', 'hf_forward'])
def test_the_next_turn_reuses_the_cache_with_the_same_results(tiny_model_dir, fast_decode):
    params = SamplingParams(max_tokens=12, temperature=0.0, stop=STOP)
    cached = sampler(tiny_model_dir, fast_decode=fast_decode)
    plain = sampler(tiny_model_dir, fast_decode=False, prefix_cache_bytes=0)  # the HF forward, every token again
    first, second = two_turns(cached, params)
    want_first, want_second = two_turns(plain, params)
    assert_same(first, want_first)
    assert_same(second, want_second)
    stats = cached.prefix_cache_stats
    assert stats['hits'] == len(FIRST_TURNS)  # every second turn extends its first turn
    # each hit skips the whole first turn: the prompt and all its sampled tokens but the last
    assert stats['reused_tokens'] == sum(len(p) + len(r.sequences[0].tokens) - 1 for p, r in zip(FIRST_TURNS, first))
    assert plain.prefix_cache_stats['hits'] == 0 and plain.prefix_cache_stats['entries'] == 0
    # sampled turns (temperature 1, a seed) agree as well
    seeded = SamplingParams(max_tokens=12, temperature=1.0, seed=7, num_samples=2, stop=STOP)
    assert_same(two_turns(cached, seeded)[1], two_turns(plain, seeded)[1])


def test_a_prompt_sharing_only_a_first_part_reuses_that_part(tiny_model_dir):
    params = SamplingParams(max_tokens=6, temperature=0.0)
    cached, plain = sampler(tiny_model_dir), sampler(tiny_model_dir, prefix_cache_bytes=0)
    system = list(range(100, 140))  # a shared system prompt of 40 tokens
    cached.sample([system + [3, 4, 5]], params)
    branch = [system + [6, 7, 8, 9]]
    assert_same(cached.sample(branch, params), plain.sample(branch, params))
    assert cached.prefix_cache_stats['hits'] == 1
    assert cached.prefix_cache_stats['reused_tokens'] == 40  # the common part, not the diverging rest


def test_new_weights_drop_the_entries(tiny_model_dir):
    from twinkle_core.model import TransformersModel

    params = SamplingParams(max_tokens=8, temperature=0.0)
    model = TransformersModel(model_id=tiny_model_dir)
    shared = sampler(None, model=model)
    first, _ = two_turns(shared, params)
    assert shared.prefix_cache_stats['entries'] > 0
    # an optimizer step on the shared model moves the weights under the sampler
    model.set_optimizer('AdamW', lr=1e-2)
    model.forward_backward(inputs=[{'input_ids': FIRST_TURNS[0], 'labels': FIRST_TURNS[0]}])
    model.clip_grad_and_step()
    hits = shared.prefix_cache_stats['hits']
    after = shared.sample(FIRST_TURNS, params)
    assert shared.prefix_cache_stats['hits'] == hits  # nothing computed with the old weights was reused
    reference = sampler(None, model=model, prefix_cache_bytes=0).sample(FIRST_TURNS, params)
    assert_same(after, reference)
    assert any(a.sequences[0].tokens != b.sequences[0].tokens for a, b in zip(after, first))
    # a weight load through the sampler empties the cache as well
    shared.load_weights({'lm_head.weight': model.model.lm_head.weight.detach() * 0.5})
    assert shared.prefix_cache_stats['entries'] == 0


def test_entries_belong_to_their_adapter(tiny_model_dir):
    params = SamplingParams(max_tokens=8, temperature=0.0)
    _, config, tensors = peft_adapter(tiny_model_dir, 1, 4)
    cached, plain = sampler(tiny_model_dir), sampler(tiny_model_dir, prefix_cache_bytes=0)
    for s in (cached, plain):
        s.add_adapter('alpha', config, tensors)
    two_turns(cached, params)  # base-weight entries
    hits = cached.prefix_cache_stats['hits']
    got = two_turns(cached, params, adapter='alpha')
    assert cached.prefix_cache_stats['hits'] == hits + len(FIRST_TURNS)  # only alpha's own first turns
    want = two_turns(plain, params, adapter='alpha')
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])


def test_the_budget_holds_and_evicts_the_oldest(tiny_model_dir):
    s = sampler(tiny_model_dir)
    s.sample(FIRST_TURNS[:1], max_tokens=4, temperature=0.0)
    one = s.prefix_cache_stats['bytes']
    small = sampler(tiny_model_dir, prefix_cache_bytes=int(2.5 * one))
    small.sample(FIRST_TURNS[:1], max_tokens=4, temperature=0.0)
    small.sample([[300 + i] * 20 for i in range(4)], max_tokens=4, temperature=0.0)
    stats = small.prefix_cache_stats
    assert stats['bytes'] <= int(2.5 * one) and stats['entries'] == 2
    small.sample([FIRST_TURNS[0] + [50]], max_tokens=4, temperature=0.0)
    assert small.prefix_cache_stats['hits'] == 0  # the first entry was the least recently used: evicted
    with pytest.raises(InvalidInputError, match='prefix_cache_bytes'):
        sampler(tiny_model_dir, prefix_cache_bytes=-1)


def test_equal_prompts_in_one_call_share_a_prefill_and_draw_apart(tiny_model_dir):
    """Copies of a prompt in one seeded call share its prefill; the first copy and a distinct prompt get what they
    get alone, every further copy draws a stream of its own (reproducibly)."""
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=3, stop=STOP)
    s = sampler(tiny_model_dir, prefix_cache_bytes=0)
    prompts = [FIRST_TURNS[0], FIRST_TURNS[1], FIRST_TURNS[0], FIRST_TURNS[0]]
    together = s.sample(prompts, params)
    alone = [s.sample([p], params)[0] for p in prompts[:2]]
    assert_same(together[:2], alone)
    copies = [tuple(r.sequences[0].tokens) for r in (together[0], together[2], together[3])]
    assert len(set(copies)) == 3, copies
    assert_same(s.sample(prompts, params), together)


def test_weights_made_under_inference_mode_are_never_trusted():
    with torch.inference_mode():
        frozen = torch.nn.Linear(2, 2)
    assert weights_fingerprint(frozen, []) != weights_fingerprint(frozen, [])
    plain = torch.nn.Linear(2, 2)
    before = weights_fingerprint(plain, ['a'])
    assert weights_fingerprint(plain, ['a']) == before
    assert weights_fingerprint(plain, ['a', 'b']) != before
    with torch.no_grad():
        plain.weight.add_(1.0)
    assert weights_fingerprint(plain, ['a']) != before


def test_the_cache_keeps_only_whole_sequences_it_can_find():
    cache = PrefixCache(max_bytes=1 << 20)
    kv = [torch.zeros(2, BLOCK_TOKENS + 3, 4)]
    tokens = tuple(range(BLOCK_TOKENS + 3))
    cache.store(None, CachedSequence(tokens, kv, kv))
    assert cache.longest_prefix(None, list(tokens[:BLOCK_TOKENS])) is None  # needs a whole block and one more token
    hit = cache.longest_prefix(None, [*tokens, 99])
    assert hit is not None and hit.tokens == tokens and hit.keys[0].shape[1] == len(tokens)
    assert cache.longest_prefix('other-adapter', [*tokens, 99]) is None
    longer = [torch.zeros(2, len(tokens) + 2, 4)]
    extended = CachedSequence((*tokens, 99, 98), longer, longer)
    cache.store(None, extended, extends=hit)
    assert len(cache) == 1  # the extended sequence replaces the one it extends
    few = [torch.zeros(2, BLOCK_TOKENS - 1, 4)]
    short = CachedSequence(tuple(range(BLOCK_TOKENS - 1)), few, few)
    cache.store(None, short)
    assert len(cache) == 1  # below one block: never found, not kept
