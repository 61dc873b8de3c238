"""The Sampler contract, run against every installed sampler (TorchSampler, vLLMSampler): logprobs are the
training forward's, greedy decoding is the model's argmax, seeds reproduce, stop tokens cut, adapters added from
tensors or directories serve exactly their weights (a replaced adapter never serves stale results, also for a
prompt already in the prefix cache), streamed base weights replace the model's, and bad input changes nothing.
References are plain Hugging Face / PEFT forwards in fp32; tolerance 1e-4 on logprobs (vLLM and HF run different
kernels)."""

from __future__ import annotations

import pytest
import torch

from tests.contract.implementations import build_sampler, installed
from twinkle_core.errors import InvalidInputError
from twinkle_core.types import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [100, 200, 300, 400, 500, 600, 700]]
TARGETS = ['q_proj', 'v_proj', 'down_proj']
ATOL = 1e-4


@pytest.fixture(scope='module', params=installed('sampler'))
def sampler(request, tiny_model_dir):
    return build_sampler(request, request.param, tiny_model_dir)


@pytest.fixture(scope='module')
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def peft_adapter(model_dir, seed: int, rank: int = 4):
    """(PEFT model with a random non-zero adapter 'default', its adapter_config dict, its PEFT-format tensors)."""
    import peft
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, init_lora_weights=False)
    torch.manual_seed(seed)
    model = peft.get_peft_model(base, config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'lora_B' in name:
                p.mul_(20.0)  # strong enough to change greedy choices
    tensors = {k: v.clone() for k, v in peft.get_peft_model_state_dict(model).items()}
    return model, model.peft_config['default'].to_dict(), tensors


def forward_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1 from one unpadded forward (what training computes)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def assert_matches_forward(model, prompts, responses) -> None:
    for prompt, response in zip(prompts, responses):
        for seq in response.sequences:
            ref = forward_logprobs(model, prompt + seq.tokens)
            torch.testing.assert_close(torch.tensor(seq.logprobs), ref[len(prompt) - 1 :], atol=ATOL, rtol=0)
        if response.prompt_logprobs is not None:
            assert response.prompt_logprobs[0] is None
            torch.testing.assert_close(
                torch.tensor(response.prompt_logprobs[1:]), ref[: len(prompt) - 1], atol=ATOL, rtol=0
            )


def test_logprobs_equal_the_training_forward(sampler, hf_model):
    params = SamplingParams(
        max_tokens=10, temperature=0.9, top_k=50, top_p=0.9, seed=0, num_samples=2, prompt_logprobs=True
    )
    responses = sampler.sample([{'input_ids': p} for p in PROMPTS], params)
    assert [len(r.sequences) for r in responses] == [2, 2, 2]
    assert all(
        len(s.tokens) == len(s.logprobs) == 10 and s.stop_reason == 'length' for r in responses for s in r.sequences
    )
    assert_matches_forward(hf_model, PROMPTS, responses)


def test_top_logprobs_and_the_trainable_row_of_each_sample(sampler, hf_model):
    """`top_logprobs=k`: per generated token the k most likely (token, log p) of the raw model, most likely
    first; `new_input_feature`: prompt + completion with the prompt masked, what `forward_backward` takes."""
    responses = sampler.sample(PROMPTS[:2], max_tokens=5, temperature=1.0, seed=3, num_samples=2, top_logprobs=3)
    for prompt, response in zip(PROMPTS, responses):
        for seq in response.sequences:
            full = prompt + seq.tokens
            with torch.no_grad():
                logps = hf_model(input_ids=torch.tensor([full])).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
            reference = logps.topk(3, dim=-1)
            assert len(seq.top_logprobs) == len(seq.tokens)
            for step, (values, indices) in enumerate(zip(reference.values, reference.indices)):
                tokens = [t for t, _ in seq.top_logprobs[step]]
                got = torch.tensor([lp for _, lp in seq.top_logprobs[step]])
                torch.testing.assert_close(got, values, atol=ATOL, rtol=0)
                assert tokens == indices.tolist() or torch.allclose(values[:-1], values[1:], atol=ATOL)  # ties
            assert seq.new_input_feature == {'input_ids': full, 'labels': [-100] * len(prompt) + seq.tokens}
    plain = sampler.sample(PROMPTS[:1], max_tokens=2)[0].sequences[0]
    assert plain.top_logprobs is None and plain.logprobs is not None


def test_logprobs_k_gives_the_twinkle_documents_pairs(sampler):
    """``SamplingParams(logprobs=k)`` (vLLM's and the Twinkle documents' form): per token ``[(sampled, lp), ...]``
    then the others among the k most likely; ``[lp[0][1] for lp in seq.logprobs]`` is the float form."""
    floats, pairs = (
        sampler.sample(
            PROMPTS[:1], SamplingParams(max_tokens=6, seed=9, temperature=1.0, logprobs=form, top_logprobs=2)
        )[0].sequences[0]
        for form in (True, 2)
    )
    assert pairs.tokens == floats.tokens
    assert [lp[0][0] for lp in pairs.logprobs] == pairs.tokens
    assert [lp[0][1] for lp in pairs.logprobs] == pytest.approx(floats.logprobs, abs=ATOL)
    for step, top in zip(pairs.logprobs, floats.top_logprobs):
        others = [t for t, _ in top if t != step[0][0]]
        assert [t for t, _ in step[1:]] == others and 2 <= len(step) <= 3
    with pytest.raises(ValueError, match='logprobs must be'):
        SamplingParams(logprobs=-1)


def test_the_trainable_row_carries_the_prompt_rows_fields(sampler, tiny_model_dir):
    """A Trajectory prompt's sample: its ``ground_truth`` and messages + the completion as the assistant turn,
    what the rewards read (the Twinkle documents pass ``new_input_feature`` to GSM8K rewards)."""
    sampler.set_template('Template', model_id=str(tiny_model_dir))  # encodes the Trajectory prompt
    row = {'messages': [{'role': 'user', 'content': 'What is 2+3?'}], 'ground_truth': '5'}
    seq = sampler.sample([row], max_tokens=4, temperature=0.0)[0].sequences[0]
    feature = seq.new_input_feature
    assert feature['ground_truth'] == '5' and feature['messages'][:1] == row['messages']
    assert feature['messages'][-1] == {'role': 'assistant', 'content': seq.text}
    assert feature['input_ids'][-len(seq.tokens) :] == seq.tokens
    assert feature['labels'] == [-100] * (len(feature['input_ids']) - len(seq.tokens)) + seq.tokens


def test_greedy_tokens_are_the_models_argmax(sampler, hf_model):
    for prompt, response in zip(PROMPTS, sampler.sample(PROMPTS, max_tokens=8, temperature=0.0)):
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None)[
            0, len(prompt) :
        ].tolist()
        assert response.sequences[0].tokens == expected


def test_a_seed_reproduces_whatever_else_is_in_the_batch(sampler):
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=11, num_samples=3)
    alone = sampler.sample([PROMPTS[1]], params)[0]
    batched = sampler.sample([PROMPTS[0], PROMPTS[1]], params)[1]
    assert [s.tokens for s in alone.sequences] == [s.tokens for s in batched.sequences]
    assert len({tuple(s.tokens) for s in alone.sequences}) > 1  # each sample has its own stream


def test_the_prompts_of_one_seeded_call_draw_independently(sampler):
    """At a temperature that flattens the random fixture's distributions to near-uniform, two different prompts would
    draw the same tokens if they shared one random stream; each prompt has its own (a shared stream made the s-th
    samples of a seeded GRPO batch move in lockstep)."""
    params = SamplingParams(max_tokens=8, temperature=2.0, seed=11, num_samples=2)  # vLLM allows at most 2
    first, second = sampler.sample([PROMPTS[0], PROMPTS[1]], params)
    for a, b in zip(first.sequences, second.sequences):
        assert a.tokens != b.tokens
    again = sampler.sample([PROMPTS[1], PROMPTS[0]], params)  # and each stays reproducible wherever it stands
    assert [s.tokens for s in again[1].sequences] == [s.tokens for s in first.sequences]


def test_a_stop_token_cuts_and_is_kept(sampler):
    free = sampler.sample([PROMPTS[2]], max_tokens=12, seed=5)[0].sequences[0]
    stop_at = next(i for i, t in enumerate(free.tokens) if free.tokens.index(t) == i and i >= 2)
    cut = sampler.sample([PROMPTS[2]], max_tokens=12, seed=5, stop=[free.tokens[stop_at]])[0].sequences[0]
    assert cut.tokens == free.tokens[: stop_at + 1] and cut.stop_reason == 'stop'
    assert cut.logprobs == pytest.approx(free.logprobs[: stop_at + 1], abs=ATOL)


def test_adapters_serve_their_own_weights_mixed_in_one_call(sampler, tiny_model_dir, tmp_path, hf_model):
    alpha, alpha_config, alpha_tensors = peft_adapter(tiny_model_dir, seed=1, rank=4)
    beta, _, _ = peft_adapter(tiny_model_dir, seed=2, rank=8)
    beta.save_pretrained(tmp_path / 'beta')
    sampler.add_adapter('alpha', alpha_config, alpha_tensors)
    sampler.add_adapter('beta', path=str(tmp_path / 'beta'))
    try:
        assert {'alpha', 'beta'} <= set(sampler.list_adapters())
        names = ['alpha', 'beta', None]
        mixed = sampler.sample(PROMPTS, max_tokens=8, temperature=0.0, prompt_logprobs=True, adapter_name=names)
        for prompt, name, response in zip(PROMPTS, names, mixed):
            reference = {'alpha': alpha, 'beta': beta, None: hf_model}[name]
            assert_matches_forward(reference, [prompt], [response])
            solo = sampler.sample([prompt], max_tokens=8, temperature=0.0, adapter_name=name)[0]
            assert solo.sequences[0].tokens == response.sequences[0].tokens
        base = sampler.sample([PROMPTS[0]], max_tokens=8, temperature=0.0)[0].sequences[0].tokens
        assert mixed[0].sequences[0].tokens != base  # the adapter changes what is generated
    finally:
        for name in ('alpha', 'beta'):
            sampler.remove_adapter(name)
    assert not {'alpha', 'beta'} & set(sampler.list_adapters())
    with pytest.raises(InvalidInputError, match='Unknown adapter'):
        sampler.sample([PROMPTS[0]], max_tokens=2, adapter_name='alpha')


def test_a_replaced_adapter_never_serves_stale_results(sampler, tiny_model_dir):
    first, config, first_tensors = peft_adapter(tiny_model_dir, seed=3)
    second, _, second_tensors = peft_adapter(tiny_model_dir, seed=4)
    long_prompt = list(range(20, 120))  # long enough to fill prefix-cache blocks
    sampler.add_adapter('tenant', config, first_tensors)
    try:
        before = sampler.sample([long_prompt], max_tokens=6, temperature=0.0, adapter_name='tenant')
        assert_matches_forward(first, [long_prompt], before)
        sampler.add_adapter('tenant', config, second_tensors)  # same name, new weights
        after = sampler.sample(
            [long_prompt], max_tokens=6, temperature=0.0, prompt_logprobs=True, adapter_name='tenant'
        )
        assert_matches_forward(second, [long_prompt], after)
    finally:
        sampler.remove_adapter('tenant')


def test_streamed_base_weights_replace_the_model(sampler, tiny_model_dir, hf_model):
    from transformers import AutoModelForCausalLM

    changed = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every weight moves, the (tied) embedding included, as after full-parameter training
        for p in changed.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    original = {k: v.clone() for k, v in hf_model.state_dict().items()}
    items = list(changed.state_dict().items())
    try:
        sampler.begin_weight_update()
        for start in range(0, len(items), 7):  # several buckets, as a streamed update sends them
            sampler.load_weights(items[start : start + 7])
        sampler.end_weight_update()
        responses = sampler.sample(PROMPTS, max_tokens=6, temperature=0.0, prompt_logprobs=True)
        assert_matches_forward(changed, PROMPTS, responses)
    finally:
        sampler.begin_weight_update()
        sampler.load_weights(original)
        sampler.end_weight_update()
    assert_matches_forward(hf_model, PROMPTS, sampler.sample(PROMPTS, max_tokens=4, temperature=0.0))


@pytest.mark.parametrize(
    'weights, message',
    [
        ({'model.layers.0.self_attn.q_proj.weight': torch.zeros(3, 3)}, 'has shape'),
        ({'model.layers.0.no_such.weight': torch.zeros(3)}, 'no base weight named'),
    ],
)
def test_bad_base_weights_are_refused_and_change_nothing(sampler, hf_model, weights, message):
    good = dict(hf_model.state_dict())
    with pytest.raises(InvalidInputError, match=message):
        sampler.load_weights({**good, **weights})
    assert_matches_forward(hf_model, PROMPTS[:1], sampler.sample(PROMPTS[:1], max_tokens=4, temperature=0.0))


@pytest.mark.parametrize(
    'call, message',
    [
        (lambda s: s.sample([[5, 6]], max_tokens=100_000), 'exceeds'),
        (lambda s: s.sample([[5, 10**7]], max_tokens=2), 'outside the vocabulary'),
        (lambda s: s.sample([[5, 6]], max_tokens=2, adapter_name='nobody'), 'Unknown adapter'),
        (lambda s: s.add_adapter('x', {'r': 4}), 'exactly one of tensors= or path='),
        (lambda s: s.remove_adapter('nobody'), 'Unknown adapter'),
    ],
)
def test_bad_input_is_refused_clearly(sampler, call, message):
    with pytest.raises(InvalidInputError, match=message):
        call(sampler)
    assert sampler.sample([[5, 6]], max_tokens=2)[0].sequences  # still serving


def test_prompt_top_logprobs_and_last_n_are_the_forwards(sampler, hf_model):
    """`prompt_top_logprobs=k`: per prompt position the k most likely (token, log p) of the raw model there (None at
    position 0); `prompt_logprobs_last_n=n`: both prompt outputs None before the last n positions. Checked
    tie-robustly: each value is the reference's log p of its token, and the values are the reference's k largest."""
    caps = sampler.capabilities
    assert caps.prompt_top_logprobs and (caps.max_top_logprobs is None or caps.max_top_logprobs >= 3)
    prompts = [PROMPTS[0], PROMPTS[2]]
    for last_n in (None, 2):
        params = SamplingParams(
            max_tokens=2, prompt_logprobs=True, prompt_top_logprobs=3, prompt_logprobs_last_n=last_n
        )
        for prompt, response in zip(prompts, sampler.sample(prompts, params)):
            with torch.no_grad():
                ref = hf_model(input_ids=torch.tensor([prompt])).logits[0].float().log_softmax(-1)
            first = 1 if last_n is None else len(prompt) - last_n
            assert response.prompt_logprobs[:first] == [None] * first
            assert response.prompt_top_logprobs[:first] == [None] * first
            assert len(response.prompt_top_logprobs) == len(response.prompt_logprobs) == len(prompt)
            for p in range(first, len(prompt)):
                top = response.prompt_top_logprobs[p]
                tokens, got = [t for t, _ in top], torch.tensor([lp for _, lp in top])
                assert len(set(tokens)) == 3 and got.tolist() == sorted(got.tolist(), reverse=True)
                torch.testing.assert_close(got, ref[p - 1, tokens], atol=ATOL, rtol=0)
                torch.testing.assert_close(got, ref[p - 1].topk(3).values, atol=ATOL, rtol=0)
                assert response.prompt_logprobs[p] == pytest.approx(float(ref[p - 1, prompt[p]]), abs=ATOL)
    with pytest.raises(InvalidInputError, match='prompt_logprobs_last_n=5 is more than'):
        sampler.sample([[5, 6, 7]], max_tokens=1, prompt_logprobs=True, prompt_logprobs_last_n=5)


def test_prompt_target_and_alt_tokens_or_a_clear_refusal(sampler, hf_model):
    """`prompt_target_tokens` (log p of chosen ids at prompt positions, 0.0 for -1) and `prompt_alt_tokens` (seeded
    draws with their raw log p) where the sampler declares them; an InvalidInputError naming them where not."""
    prompt = PROMPTS[2]
    targets = [[-1, -1]] * (len(prompt) - 1)
    targets[-1], targets[1] = [3, 4], [prompt[2], -1]
    caps = sampler.capabilities
    if not caps.prompt_target_logprobs:
        with pytest.raises(InvalidInputError, match='does not support prompt_target_tokens'):
            sampler.sample([prompt], max_tokens=1, prompt_target_tokens=targets)
    if not caps.prompt_alt_tokens:
        with pytest.raises(InvalidInputError, match='does not support prompt_alt_tokens'):
            sampler.sample([prompt], max_tokens=1, prompt_alt_tokens=2)
    if not (caps.prompt_target_logprobs and caps.prompt_alt_tokens):
        return
    with torch.no_grad():
        ref = hf_model(input_ids=torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    out = sampler.sample([prompt], max_tokens=1, seed=4, prompt_target_tokens=targets, prompt_alt_tokens=3)[0]
    ids = torch.tensor(targets)
    expected = ref[:-1].gather(-1, ids.clamp(min=0)).masked_fill(ids < 0, 0.0)
    torch.testing.assert_close(torch.tensor(out.prompt_target_logprobs), expected, atol=ATOL, rtol=0)
    draws = torch.tensor([[t for t, _ in row] for row in out.prompt_alt_tokens])
    assert draws.shape == (len(prompt) - 1, 3)
    got = torch.tensor([[lp for _, lp in row] for row in out.prompt_alt_tokens])
    torch.testing.assert_close(got, ref[:-1].gather(-1, draws), atol=ATOL, rtol=0)
    again = sampler.sample([prompt], max_tokens=1, seed=4, prompt_alt_tokens=3)[0].prompt_alt_tokens
    assert again == out.prompt_alt_tokens  # the draws' own stream: the same seed gives the same draws
    with pytest.raises(InvalidInputError, match='has 2 rows'):
        sampler.sample([prompt], max_tokens=1, prompt_target_tokens=[[1], [2]])
