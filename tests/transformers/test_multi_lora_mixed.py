"""Mixed-tenant forward/backward equals training each tenant alone with plain peft (docs/architecture.md §4)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_multi_lora_helpers import peft_grads, peft_state, random_peft_model, reference_loss, text_rows

TENANTS = {  # different ranks, alphas, targets, rslora -- and different data and losses
    'alice': dict(r=4, lora_alpha=8, target_modules='all-linear'),
    'bob': dict(r=8, lora_alpha=16, target_modules=['q_proj', 'v_proj', 'down_proj']),
    'carol': dict(r=16, lora_alpha=8, target_modules='all-linear', use_rslora=True),
}
DATA = {
    'alice': ['I am Alice, a helpful assistant.', 'My name is Alice.', 'Alice was built by the twinkle team.'],
    'bob': ['Bob speaks here about the weather today and tomorrow.', 'Hello from Bob.'],
    'carol': ['Carol: a third tenant with a single, somewhat longer sequence of text to train on.'],
}


@pytest.fixture(scope='module')
def base(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def _engine_and_references(base, *, padding_free: bool = False):
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    engine = MultiLoraTransformersModel(model=copy.deepcopy(base), device='cpu', pass_strategy='mixed')
    references = {}
    for seed, (name, cfg) in enumerate(TENANTS.items()):
        references[name] = random_peft_model(base, cfg, seed)
        engine.add_adapter_to_model(name, cfg)
        engine.manager.load_state_dict(name, peft_state(references[name]))
        if padding_free:
            engine.set_processor('CausalLMProcessor', padding_free=True, adapter_name=name)
    engine.set_loss('CrossEntropyLoss', reduction='sum', adapter_name='carol')  # a different loss, same pass
    return engine, references


@pytest.mark.parametrize('padding_free', [False, True], ids=['padded', 'packed'])
def test_mixed_pass_matches_peft_per_tenant(base, tokenizer, padding_free):
    engine, references = _engine_and_references(base, padding_free=padding_free)
    rows = {name: text_rows(tokenizer, texts) for name, texts in DATA.items()}

    out = engine.forward_backward(inputs=rows)

    assert set(out) == set(TENANTS)
    for name, peft_model in references.items():
        ref_loss, ref_logprobs = reference_loss(
            peft_model, rows[name], reduction='sum' if name == 'carol' else 'token_mean'
        )
        ref_loss.backward()
        assert out[name]['loss'] == pytest.approx(ref_loss.item(), rel=1e-5, abs=1e-5), name
        for got, want in zip(out[name]['logprobs'], ref_logprobs):
            assert len(got) == len(want)
            torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=1e-5)
        ours = dict(engine.manager.named_parameters(name))
        want_grads = peft_grads(peft_model)
        assert set(ours) == set(want_grads), name
        for key, grad in want_grads.items():
            assert grad is not None and grad.abs().sum() > 0, key
            torch.testing.assert_close(ours[key].grad, grad, atol=1e-5, rtol=1e-5, msg=f'{name}: {key}')


def test_gradients_land_only_in_each_tenants_adapter(base, tokenizer):
    engine, _ = _engine_and_references(base)
    rows = {'alice': text_rows(tokenizer, DATA['alice']), 'bob': text_rows(tokenizer, DATA['bob'])}
    engine.forward_backward(inputs=rows)
    assert all(p.grad is not None for p in engine.manager.parameters('alice'))
    assert all(p.grad is not None for p in engine.manager.parameters('bob'))
    assert all(p.grad is None for p in engine.manager.parameters('carol'))
    assert all(p.grad is None for n, p in engine.model.named_parameters() if '.adapters.' not in n)


def test_mixed_accumulation_adds_to_earlier_micro_batches(base, tokenizer):
    """Two accumulated mixed passes give each tenant the sum of its two micro-batch gradients."""
    engine, references = _engine_and_references(base)
    first = {'alice': text_rows(tokenizer, DATA['alice'][:1]), 'bob': text_rows(tokenizer, DATA['bob'][:1])}
    second = {'alice': text_rows(tokenizer, DATA['alice'][1:]), 'bob': text_rows(tokenizer, DATA['bob'][1:])}
    engine.forward_backward(inputs=first)
    engine.forward_backward(inputs=second)
    for name in ('alice', 'bob'):
        peft_model = references[name]
        for part in (first, second):
            reference_loss(peft_model, part[name])[0].backward()
        ours = dict(engine.manager.named_parameters(name))
        for key, grad in peft_grads(peft_model).items():
            torch.testing.assert_close(ours[key].grad, grad, atol=1e-5, rtol=1e-5)


def test_rows_carrying_adapter_name_are_mixed_too(base, tokenizer):
    engine, _ = _engine_and_references(base)
    rows = [dict(r, adapter_name='alice') for r in text_rows(tokenizer, DATA['alice'])]
    rows += [dict(r, adapter_name='bob') for r in text_rows(tokenizer, DATA['bob'])]
    out = engine.forward_only(inputs=rows)
    alone = engine.forward_only(inputs=text_rows(tokenizer, DATA['bob']), adapter_name='bob')
    assert out['bob']['loss'] == pytest.approx(alone['loss'], abs=1e-6)
    assert set(out) == {'alice', 'bob'}


def test_forward_only_mixed_matches_forward_backward_logprobs(base, tokenizer):
    engine, _ = _engine_and_references(base)
    rows = {name: text_rows(tokenizer, texts) for name, texts in DATA.items()}
    rows['dave_logprobs_only'] = [{'input_ids': r['input_ids']} for r in rows['alice']]
    engine.add_adapter_to_model('dave_logprobs_only', dict(r=2, target_modules=['q_proj']))
    evaluated = engine.forward_only(inputs=rows)
    assert 'loss' not in evaluated['dave_logprobs_only']
    # dave's adapter starts as identity (B = 0), so its logprobs are the base model's
    _, base_logprobs = reference_loss(base, [dict(r, labels=r['input_ids']) for r in rows['alice']])
    for got, want in zip(evaluated['dave_logprobs_only']['logprobs'], base_logprobs):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=1e-5)
    del rows['dave_logprobs_only']
    trained = engine.forward_backward(inputs=rows)
    for name in TENANTS:
        assert evaluated[name]['loss'] == pytest.approx(trained[name]['loss'], abs=1e-6)


def test_split_forward_calculate_loss_backward_equals_forward_backward(base, tokenizer):
    rows = {name: text_rows(tokenizer, texts) for name, texts in DATA.items()}
    fused, _ = _engine_and_references(base)
    split, _ = _engine_and_references(base)
    expected = fused.forward_backward(inputs=rows)

    logprobs = split.forward(inputs=rows)
    losses = split.calculate_loss()
    out = split.backward()

    for name in TENANTS:
        assert logprobs[name]['logprobs'] == expected[name]['logprobs']
        assert losses[name] == out[name]['loss'] == expected[name]['loss']
        for (key, p), (_, q) in zip(fused.manager.named_parameters(name), split.manager.named_parameters(name)):
            assert torch.equal(p.grad, q.grad), key
    with pytest.raises(Exception, match='needs a preceding forward'):
        split.backward()


@pytest.mark.parametrize('padding_free', [False, True], ids=['padded', 'packed'])
def test_rl_tenant_mixed_with_sft_tenants_equals_running_it_alone(base, tokenizer, padding_free):
    """Per-token RL fields (advantages, old_logps) of one tenant reach only its loss, whatever the others send."""
    rl_rows = text_rows(tokenizer, DATA['carol'] + DATA['bob'])
    g = torch.Generator().manual_seed(0)
    for row in rl_rows:
        n = len(row['input_ids'])
        row['advantages'] = (torch.randn(1, generator=g).item() * torch.ones(n)).tolist()
        row['old_logps'] = (-3.0 + 0.1 * torch.randn(n, generator=g)).tolist()
    runs = []
    for mixed in (True, False):
        engine, _ = _engine_and_references(base, padding_free=padding_free)
        engine.set_loss('GRPOLoss', adapter_name='carol')
        if mixed:
            out = engine.forward_backward(
                inputs={
                    'alice': text_rows(tokenizer, DATA['alice']),
                    'carol': rl_rows,
                    'bob': text_rows(tokenizer, DATA['bob']),
                }
            )['carol']
        else:
            out = engine.forward_backward(inputs=rl_rows, adapter_name='carol')
        runs.append((out, dict(engine.manager.named_parameters('carol'))))
    (mixed_out, mixed_params), (alone_out, alone_params) = runs
    assert mixed_out['loss'] == pytest.approx(alone_out['loss'], abs=1e-6)
    assert mixed_out['metrics'] == pytest.approx(alone_out['metrics'], abs=1e-6)
    for key, p in alone_params.items():
        assert p.grad.abs().sum() > 0
        torch.testing.assert_close(mixed_params[key].grad, p.grad, atol=1e-6, rtol=1e-5)


def test_gradient_checkpointing_recomputes_with_the_same_routing(base, tokenizer):
    rows = {name: text_rows(tokenizer, DATA[name]) for name in ('alice', 'bob')}
    plain, _ = _engine_and_references(base)
    checkpointed, _ = _engine_and_references(base)
    checkpointed.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})
    plain.forward_backward(inputs=rows)
    checkpointed.forward_backward(inputs=rows)
    for name in rows:
        for (key, p), (_, q) in zip(plain.manager.named_parameters(name), checkpointed.manager.named_parameters(name)):
            torch.testing.assert_close(q.grad, p.grad, atol=1e-6, rtol=1e-5, msg=key)
