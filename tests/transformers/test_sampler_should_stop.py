"""TorchSampler's ``should_stop=`` (a cancelled request, issue 46 defect 10): a prompt whose predicate turns true
stops being decoded at the next step, cut short with ``stop_reason='length'``; the other prompts of the batch get
exactly what they get without the predicate; a prompt stopped before its batch starts is never decoded."""

from __future__ import annotations

from collections import Counter

import pytest

from twinkle_core.types import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [10, 11]]
PARAMS = SamplingParams(max_tokens=24, temperature=1.0, seed=3, num_samples=2)
K = 3  # prompt 0 is told to stop at its K-th check


@pytest.fixture(scope='module')
def samplers(tiny_model_dir):
    from twinkle_transformers.sampler import TorchSampler

    fast = TorchSampler(tiny_model_dir, device='cpu')
    return {
        'fast': fast,
        'hf': TorchSampler(model=fast.model, tokenizer=fast.tokenizer, fast_decode=False),
        'one prompt per batch': TorchSampler(model=fast.model, tokenizer=fast.tokenizer, max_batch_size=2),
    }


def _stop_after(prompt: int, checks: int):
    """A predicate that says stop for `prompt` from its `checks`-th call on; every call is counted."""
    calls: Counter[int] = Counter()

    def should_stop(index: int) -> bool:
        calls[index] += 1
        return index == prompt and calls[index] > checks

    return should_stop, calls


@pytest.mark.parametrize('kind', ['fast', 'hf', 'one prompt per batch'])
def test_a_stopped_prompt_ends_early_and_the_others_are_unchanged(samplers, kind):
    sampler = samplers[kind]
    assert sampler.capabilities.stops_rows
    free = sampler.sample(PROMPTS, PARAMS)
    assert all(len(s.tokens) > K + 1 for s in free[0].sequences)  # the stop, not EOS, is what cuts prompt 0
    should_stop, calls = _stop_after(0, K)
    cut = sampler.sample(PROMPTS, PARAMS, should_stop=should_stop)
    for stopped, full in zip(cut[0].sequences, free[0].sequences):
        assert 1 <= len(stopped.tokens) <= K + 1 and stopped.stop_reason == 'length'
        assert stopped.tokens == full.tokens[: len(stopped.tokens)]  # the same stream, cut short
    assert [s.tokens for s in cut[1].sequences] == [s.tokens for s in free[1].sequences]
    for a, b in zip(cut[1].sequences, free[1].sequences):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert calls[0] == K + 1  # checked once per step, never again once stopped
    assert calls[1] == 1 + max(len(s.tokens) for s in free[1].sequences)  # once before the prefill, once per step


def test_a_prompt_stopped_before_its_batch_starts_is_not_decoded(samplers):
    sampler = samplers['fast']
    free = sampler.sample(PROMPTS, PARAMS)
    cut = sampler.sample(PROMPTS, PARAMS, should_stop=lambda index: index == 1)
    assert [s.tokens for s in cut[1].sequences] == [[], []]
    assert all(s.stop_reason == 'length' for s in cut[1].sequences)
    assert [s.tokens for s in cut[0].sequences] == [s.tokens for s in free[0].sequences]
    everything = sampler.sample(PROMPTS, PARAMS, should_stop=lambda index: True)
    assert [len(s.tokens) for r in everything for s in r.sequences] == [0, 0, 0, 0]
