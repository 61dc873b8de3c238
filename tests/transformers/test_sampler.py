"""TorchSampler on the tiny fixture model: logprobs match the training forward, greedy matches HF generate,
stop conditions cut tokens/logprobs/text consistently, seeds reproduce, bad input is refused clearly."""

from __future__ import annotations

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [100, 200, 300, 400, 500, 600, 700]]


@pytest.fixture(scope='module')
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope='module')
def sampler(tiny_model_dir):
    from twinkle_transformers.sampler import TorchSampler

    return TorchSampler(tiny_model_dir, device='cpu')


def reference_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1 from one unpadded forward (what training computes)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_logprobs_equal_training_forward(sampler, hf_model):
    params = SamplingParams(
        max_tokens=12, temperature=0.9, top_k=50, top_p=0.9, seed=0, num_samples=2, prompt_logprobs=True
    )
    responses = sampler.sample([{'input_ids': p} for p in PROMPTS], params)
    assert len(responses) == len(PROMPTS)
    for prompt, response in zip(PROMPTS, responses):
        assert len(response.sequences) == 2
        assert response.prompt_logprobs[0] is None and len(response.prompt_logprobs) == len(prompt)
        for seq in response.sequences:
            assert len(seq.tokens) == len(seq.logprobs) == 12 and seq.stop_reason == 'length'
            ref = reference_logprobs(hf_model, prompt + seq.tokens)
            torch.testing.assert_close(torch.tensor(seq.logprobs), ref[len(prompt) - 1 :], atol=1e-4, rtol=0)
            torch.testing.assert_close(
                torch.tensor(response.prompt_logprobs[1:]), ref[: len(prompt) - 1], atol=1e-4, rtol=0
            )


def test_temperature_zero_equals_hf_greedy_generate(sampler, hf_model):
    responses = sampler.sample(PROMPTS, max_tokens=10, temperature=0.0)
    for prompt, response in zip(PROMPTS, responses):
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None)[
            0, len(prompt) :
        ].tolist()
        assert response.sequences[0].tokens == expected


def test_stop_token_id_cuts_and_keeps_the_stop_token(sampler):
    free = sampler.sample([PROMPTS[0]], max_tokens=12, seed=5)[0].sequences[0]
    stop_at = next(i for i, t in enumerate(free.tokens) if free.tokens.index(t) == i and i >= 2)
    cut = sampler.sample([PROMPTS[0]], max_tokens=12, seed=5, stop=[free.tokens[stop_at]])[0].sequences[0]
    assert cut.stop_reason == 'stop'
    assert cut.tokens == free.tokens[: stop_at + 1]
    assert cut.logprobs == pytest.approx(free.logprobs[: stop_at + 1], abs=1e-6)


def test_stop_string_cuts_after_the_completing_token(sampler):
    prompt = PROMPTS[2]
    free = sampler.sample([prompt], max_tokens=16, temperature=1.0, seed=7)[0].sequences[0]
    pieces = [sampler.tokenizer.decode([t]) for t in free.tokens]
    k = next(i for i in range(3, len(pieces)) if len(pieces[i].strip()) >= 2 and pieces[i] not in ''.join(pieces[:i]))
    stop = pieces[k][:2]  # a string completed inside token k
    cut = sampler.sample([prompt], max_tokens=16, temperature=1.0, seed=7, stop=stop)[0].sequences[0]
    assert cut.stop_reason == 'stop'
    first = next(i for i in range(len(pieces)) if stop in ''.join(pieces[: i + 1]))
    assert cut.tokens == free.tokens[: first + 1] and len(cut.logprobs) == len(cut.tokens)
    assert stop in cut.text and stop not in sampler.tokenizer.decode(cut.tokens[:-1])


def test_fast_decode_equals_hf_forward_path(sampler, tiny_model_dir):
    """The lean Llama-family decode step (with fused weights) and the plain HF forward give the same results."""
    from twinkle_transformers.sampler import TorchSampler

    plain = TorchSampler(tiny_model_dir, device='cpu', fast_decode=False)
    params = SamplingParams(max_tokens=12, seed=21, num_samples=2, top_k=20)
    fast_out, plain_out = sampler.sample(PROMPTS, params), plain.sample(PROMPTS, params)
    assert sampler._fast_decoder(sampler.model) is not None and plain._fast_decoder(plain.model) is None
    for a, b in zip(fast_out, plain_out):
        for x, y in zip(a.sequences, b.sequences):
            assert x.tokens == y.tokens
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


def test_sampling_frequencies_follow_the_filtered_distribution():
    """top-k / top-p draws follow the renormalised kept distribution (and never pick a filtered token)."""
    from twinkle_transformers.sampler.sampling import TokenChooser

    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    generator = torch.Generator().manual_seed(0)
    for chooser, kept in (
        (TokenChooser(1.0, 3, 1.0), 3),
        (TokenChooser(1.0, -1, 0.8), 3),
        (TokenChooser(0.5, -1, 1.0), 5),
    ):
        counts = torch.zeros(5)
        for _ in range(4000):
            counts[chooser.choose(logits, [generator])] += 1
        expected = (logits[0, :kept] / chooser.temperature).softmax(-1)
        assert counts[kept:].sum() == 0
        torch.testing.assert_close(counts[:kept] / 4000, expected, atol=0.03, rtol=0)


def test_eos_stops_when_no_stop_is_given(tiny_model_dir):
    from twinkle_transformers.sampler import TorchSampler

    own = TorchSampler(tiny_model_dir, device='cpu')
    free = own.sample([PROMPTS[1]], max_tokens=8, temperature=0.0)[0].sequences[0]
    own.model.generation_config.eos_token_id = free.tokens[3]
    own.tokenizer = None  # EOS from the generation config only
    seq = own.sample([PROMPTS[1]], max_tokens=8, temperature=0.0)[0].sequences[0]
    assert seq.stop_reason == 'stop' and seq.tokens == free.tokens[: free.tokens.index(free.tokens[3]) + 1]
    assert seq.text is None  # no tokenizer, no text


def test_seed_reproduces_independently_of_batch_and_chunking(sampler):
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=123, num_samples=3)
    alone = sampler.sample([PROMPTS[1]], params)[0]
    batched = sampler.sample(PROMPTS, params)[1]
    assert [s.tokens for s in alone.sequences] == [s.tokens for s in batched.sequences]
    small = type(sampler)(model=sampler.model, tokenizer=sampler.tokenizer, max_batch_size=2)
    chunked = small.sample(PROMPTS, params)[1]
    assert [s.tokens for s in chunked.sequences] == [s.tokens for s in alone.sequences]
    assert len({tuple(s.tokens) for s in alone.sequences}) == 3  # samples of one prompt differ
    other = sampler.sample([PROMPTS[1]], params.model_copy(update={'seed': 124}))[0]
    assert [s.tokens for s in other.sequences] != [s.tokens for s in alone.sequences]


def test_unseeded_repeats_of_one_prompt_differ(sampler):
    responses = sampler.sample([PROMPTS[0], PROMPTS[0]], max_tokens=8, temperature=1.0)
    assert responses[0].sequences[0].tokens != responses[1].sequences[0].tokens


def test_trajectory_prompt_uses_chat_template_and_decodes(sampler):
    messages = [{'role': 'user', 'content': 'What is your name?'}]
    response = sampler.sample([{'messages': messages}], max_tokens=6, temperature=0.0, prompt_logprobs=True)[0]
    expected = sampler.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert len(response.prompt_logprobs) == len(expected)
    seq = response.sequences[0]
    assert seq.text == sampler.tokenizer.decode(seq.tokens, skip_special_tokens=True)


def test_set_template_by_name_encodes_trajectories(tiny_model_dir):
    from twinkle_core.registry import resolve
    from twinkle_transformers.sampler import TorchSampler

    sampler = TorchSampler(tiny_model_dir, device='cpu')
    sampler.set_template('Template')
    trajectory = {'messages': [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}]}
    response = sampler.sample(trajectory, max_tokens=4, temperature=0.0, prompt_logprobs=True)[0]
    expected = resolve('template', 'Template', model_id_or_tokenizer=tiny_model_dir).encode(
        trajectory, add_generation_prompt=True
    )['input_ids']
    assert len(response.prompt_logprobs) == len(expected)
    direct = sampler.sample([{'input_ids': expected}], max_tokens=4, temperature=0.0)[0]
    assert response.sequences[0].tokens == direct.sequences[0].tokens
    assert response.sequences[0].text == sampler.tokenizer.decode(direct.sequences[0].tokens, skip_special_tokens=True)


@pytest.mark.parametrize(
    'call, message',
    [
        (lambda s: s.sample([PROMPTS[0]], num_samples=0), 'num_samples'),
        (lambda s: s.sample([PROMPTS[0]], max_tokens=5000), 'context'),
        (lambda s: s.sample([{'input_ids': []}]), 'input_ids is empty|empty'),
        (lambda s: s.sample([[]]), 'Prompt 0 is empty'),
        (lambda s: s.sample([PROMPTS[0]], adapter_name='nope'), 'Unknown adapter'),
        (lambda s: s.sample(PROMPTS, adapter_name=[None]), 'one per prompt'),
        (lambda s: s.sample([[10**7]]), 'vocabulary'),
        (lambda s: s.sample([PROMPTS[0]], top_k=0), 'top_k'),
    ],
)
def test_bad_input_raises_clear_error(sampler, call, message):
    with pytest.raises(InvalidInputError, match=message):
        call(sampler)


def test_registered_under_sampler_kind(tiny_model_dir):
    from twinkle_core.registry import resolve

    sampler = resolve('sampler', 'TorchSampler', model_id=tiny_model_dir, device='cpu')
    assert sampler.sample([PROMPTS[0]], max_tokens=2)[0].sequences[0].tokens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_logprobs_match_forward(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from twinkle_transformers.sampler import TorchSampler

    sampler = TorchSampler(tiny_model_dir, device='cuda', dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    seq = sampler.sample([PROMPTS[0]], max_tokens=8, seed=1)[0].sequences[0]
    ref = reference_logprobs(model, PROMPTS[0] + seq.tokens)[len(PROMPTS[0]) - 1 :]
    torch.testing.assert_close(torch.tensor(seq.logprobs), ref, atol=1e-3, rtol=0)
