"""TorchSampler with LoRA adapters (real PEFT): per-adapter logprobs equal the PEFT model's forward, a batch that
mixes adapters equals per-adapter runs, adapters load from PEFT dirs or tensors, base weights load in place."""

from __future__ import annotations

import pytest
import torch

from tests.contract.test_sampler_contract import forward_logprobs, peft_adapter
from twinkle_core.errors import InvalidInputError
from twinkle_core.types import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [100, 200, 300, 400, 500, 600, 700]]


def make_peft(model_dir, seed: int, rank: int = 4):
    """A PEFT model with a random (non-zero) adapter 'default' so it changes the outputs."""
    return peft_adapter(model_dir, seed, rank)[0]


@pytest.fixture(scope='module')
def adapters(tiny_model_dir, tmp_path_factory):
    """Two saved PEFT adapters (dirs) and their PEFT models (the reference)."""
    out = {}
    for name, seed, rank in (('alpha', 1, 4), ('beta', 2, 8)):
        model = make_peft(tiny_model_dir, seed, rank)
        path = tmp_path_factory.mktemp(f'adapter_{name}')
        model.save_pretrained(path)
        out[name] = (path, model)
    return out


@pytest.fixture(scope='module')
def sampler(tiny_model_dir, adapters):
    from twinkle_transformers.sampler import TorchSampler

    s = TorchSampler(tiny_model_dir, device='cpu')
    for name, (path, _) in adapters.items():
        s.load_weights(str(path), adapter_name=name)
    return s


def test_single_adapter_logprobs_equal_peft_forward(sampler, adapters):
    _, reference = adapters['alpha']
    responses = sampler.sample(
        PROMPTS, SamplingParams(max_tokens=8, seed=3, prompt_logprobs=True), adapter_name='alpha'
    )
    for prompt, response in zip(PROMPTS, responses):
        ref = forward_logprobs(reference, prompt + response.sequences[0].tokens)
        torch.testing.assert_close(
            torch.tensor(response.sequences[0].logprobs), ref[len(prompt) - 1 :], atol=1e-4, rtol=0
        )
        torch.testing.assert_close(
            torch.tensor(response.prompt_logprobs[1:]), ref[: len(prompt) - 1], atol=1e-4, rtol=0
        )


def test_adapter_changes_outputs_and_base_is_untouched(sampler, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with_a = sampler.sample(PROMPTS, max_tokens=8, temperature=0.0, adapter_name='alpha')
    plain = sampler.sample(PROMPTS, max_tokens=8, temperature=0.0)
    assert [r.sequences[0].tokens for r in with_a] != [r.sequences[0].tokens for r in plain]
    seq = plain[2].sequences[0]
    ref = forward_logprobs(base, PROMPTS[2] + seq.tokens)[len(PROMPTS[2]) - 1 :]
    torch.testing.assert_close(torch.tensor(seq.logprobs), ref, atol=1e-4, rtol=0)


def test_mixed_adapter_batch_equals_per_adapter_runs(sampler):
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=11, num_samples=2)
    names = ['alpha', None, 'beta', 'alpha', 'beta']
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[2], PROMPTS[0]]
    mixed = sampler.sample(prompts, params, adapter_name=names)
    for prompt, name, response in zip(prompts, names, mixed):
        alone = sampler.sample([prompt], params, adapter_name=name)[0]
        assert [s.tokens for s in response.sequences] == [s.tokens for s in alone.sequences]
        for got, want in zip(response.sequences, alone.sequences):
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)


def test_per_row_adapter_field_is_used(sampler):
    rows = [{'input_ids': PROMPTS[0], 'adapter_name': 'beta'}, {'input_ids': PROMPTS[0]}]
    by_field = sampler.sample(rows, max_tokens=6, temperature=0.0)
    explicit = sampler.sample([PROMPTS[0]] * 2, max_tokens=6, temperature=0.0, adapter_name=['beta', None])
    assert [r.sequences[0].tokens for r in by_field] == [r.sequences[0].tokens for r in explicit]


def test_adapter_from_tensors_needs_config_and_replaces_in_place(tiny_model_dir, adapters):
    import peft

    from twinkle_transformers.sampler import TorchSampler

    sampler = TorchSampler(tiny_model_dir, device='cpu')
    _, reference = adapters['beta']
    tensors = peft.get_peft_model_state_dict(reference)
    with pytest.raises(InvalidInputError, match='lora_config'):
        sampler.load_weights(tensors.items(), adapter_name='tensors')
    sampler.load_weights(
        tensors.items(), adapter_name='tensors', lora_config=reference.peft_config['default'].to_dict()
    )
    seq = sampler.sample([PROMPTS[1]], max_tokens=6, seed=2, adapter_name='tensors')[0].sequences[0]
    ref = forward_logprobs(reference, PROMPTS[1] + seq.tokens)[len(PROMPTS[1]) - 1 :]
    torch.testing.assert_close(torch.tensor(seq.logprobs), ref, atol=1e-4, rtol=0)
    # Replacing: zero tensors of the same shape make the adapter a no-op.
    sampler.load_weights({k: torch.zeros_like(v) for k, v in tensors.items()}, adapter_name='tensors')
    zeroed = sampler.sample([PROMPTS[1]], max_tokens=6, temperature=0.0, adapter_name='tensors')
    plain = sampler.sample([PROMPTS[1]], max_tokens=6, temperature=0.0)
    assert zeroed[0].sequences[0].tokens == plain[0].sequences[0].tokens
    assert sampler.adapter_names == ['tensors']


def test_load_base_weights_in_place(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from twinkle_transformers.sampler import TorchSampler

    sampler = TorchSampler(tiny_model_dir, device='cpu')
    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    sampler.load_weights(other.state_dict().items())
    seq = sampler.sample([PROMPTS[0]], max_tokens=6, seed=4)[0].sequences[0]
    ref = forward_logprobs(other, PROMPTS[0] + seq.tokens)[len(PROMPTS[0]) - 1 :]
    torch.testing.assert_close(torch.tensor(seq.logprobs), ref, atol=1e-4, rtol=0)
    with pytest.raises(InvalidInputError, match='no base weight named'):
        sampler.load_weights([('model.nope.weight', torch.zeros(1))])


def test_shared_plain_model_refuses_adapter_injection(tiny_model_dir, adapters):
    from transformers import AutoModelForCausalLM

    from twinkle_transformers.sampler import TorchSampler

    shared = TorchSampler(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32))
    with pytest.raises(InvalidInputError, match='shares a model'):
        shared.load_weights(str(adapters['alpha'][0]), adapter_name='alpha')


def test_shared_peft_model_mixes_its_adapters_in_one_batch(tiny_model_dir, adapters):
    """A sampler sharing a PEFT model (as with a LoRA TransformersModel) routes rows through PEFT's mixed batches."""
    import peft

    from twinkle_transformers.sampler import TorchSampler

    reference = make_peft(tiny_model_dir, seed=5)
    shared = TorchSampler(model=reference)
    beta_path, beta_model = adapters['beta']
    shared.load_weights(str(beta_path), adapter_name='beta')
    assert shared.adapter_names == ['beta', 'default']
    params = SamplingParams(max_tokens=8, seed=9)
    names = ['default', 'beta', TorchSampler.BASE_WEIGHTS]  # two adapters: the base is asked for by name
    mixed = shared.sample(PROMPTS, params, adapter_name=names)
    for prompt, name, response in zip(PROMPTS, names, mixed):
        alone = shared.sample([prompt], params, adapter_name=name)[0].sequences[0]
        assert response.sequences[0].tokens == alone.tokens
    seq = mixed[0].sequences[0]
    ref = forward_logprobs(reference, PROMPTS[0] + seq.tokens)[len(PROMPTS[0]) - 1 :]  # active adapter: default
    torch.testing.assert_close(torch.tensor(seq.logprobs), ref, atol=1e-4, rtol=0)
    assert reference.training is False and peft.get_peft_model_state_dict(reference)  # untouched otherwise


@pytest.mark.parametrize('shared', [False, True], ids=['multi_lora', 'peft'])
def test_bad_adapter_tensors_leave_the_existing_adapter_intact(tiny_model_dir, adapters, shared):
    from twinkle_transformers.sampler import TorchSampler

    sampler = (
        TorchSampler(model=make_peft(tiny_model_dir, seed=6)) if shared else TorchSampler(tiny_model_dir, device='cpu')
    )
    sampler.load_weights(str(adapters['alpha'][0]), adapter_name='alpha')
    before = sampler.sample([PROMPTS[0]], max_tokens=6, seed=1, adapter_name='alpha')[0].sequences[0]
    bad = {'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': torch.zeros(3, 3)}
    with pytest.raises(InvalidInputError):
        sampler.load_weights(bad, adapter_name='alpha')  # same config: refused before copying
    with pytest.raises(InvalidInputError):  # a new shape that does not fit: the old adapter is restored
        sampler.load_weights(
            bad, adapter_name='alpha', lora_config={'r': 2, 'lora_alpha': 4, 'target_modules': ['q_proj']}
        )
    after = sampler.sample([PROMPTS[0]], max_tokens=6, seed=1, adapter_name='alpha')[0].sequences[0]
    assert after.tokens == before.tokens and after.logprobs == pytest.approx(before.logprobs, abs=1e-6)


def test_a_sampler_sharing_a_lora_model_samples_its_adapter_by_default(tiny_model_dir, adapters):
    """A TorchSampler over a LoRA `TransformersModel` without `adapter_name` samples what the trainer trains: its
    log-probs are the trainer's (it used to sample the base weights, off by up to ~1 nat). With two adapters there
    is no default: the error names both; the base weights are still reachable by name."""
    from twinkle_core.model import TransformersModel
    from twinkle_transformers.sampler import TorchSampler

    torch.manual_seed(0)
    trainer = TransformersModel(str(tiny_model_dir), device='cpu')
    trainer.add_adapter_to_model(
        'policy', {'r': 4, 'lora_alpha': 32, 'target_modules': 'all-linear', 'init_lora_weights': False}
    )
    sampler = TorchSampler(model=trainer)
    responses = sampler.sample(PROMPTS, SamplingParams(max_tokens=6, temperature=1.0, seed=2))
    sequences = [r.sequences[0] for r in responses]
    trained = trainer.forward_only(inputs=[s.new_input_feature for s in sequences], compute_loss=False)['logprobs']
    for seq, row in zip(sequences, trained):
        torch.testing.assert_close(torch.tensor(seq.logprobs), torch.tensor(row[-len(seq.tokens) :]), atol=1e-4, rtol=0)
    base = sampler.sample(PROMPTS, SamplingParams(max_tokens=6, temperature=1.0, seed=2), adapter_name='__base__')
    base_logprobs = sampler.sample(
        [p + s.tokens for p, s in zip(PROMPTS, sequences)], max_tokens=1, prompt_logprobs=True, adapter_name='__base__'
    )
    assert [r.sequences[0].tokens for r in base] != [s.tokens for s in sequences] or any(
        abs(a - b) > 1e-2
        for r, s in zip(base_logprobs, sequences)
        for a, b in zip(r.prompt_logprobs[-len(s.tokens) :], s.logprobs)
    )  # the base weights really differ from the adapter's
    sampler.add_adapter('beta', path=str(adapters['beta'][0]))
    with pytest.raises(InvalidInputError, match=r"\['beta', 'policy'\].*adapter_name="):
        sampler.sample(PROMPTS, max_tokens=2)
    assert sampler.sample(PROMPTS[:1], max_tokens=2, adapter_name='policy')[0].sequences
