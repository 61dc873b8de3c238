"""One tenant's bad micro-batch (NaN loss, NaN gradients, NaN per-token fields, bad rows, a raising loss) is
rejected with a clear per-tenant error, and every other tenant ends bit-for-bit where it would be without it."""

from __future__ import annotations

import math

import pytest
import torch
from test_multi_lora_helpers import text_rows

from twinkle_core.loss.base import Loss
from twinkle_transformers.multi_lora import MixedStepError, MultiLoraTransformersModel, TenantStepError

GOOD = {
    'alice': dict(r=4, lora_alpha=8, init_lora_weights=False),
    'bob': dict(r=8, lora_alpha=16, target_modules=['q_proj', 'v_proj'], init_lora_weights=False),
}
TEXTS = {
    'alice': ['I am Alice, built by the twinkle team.', 'Alice answers questions.'],
    'bob': ['Bob talks about the weather.', 'Bob says hello to you.'],
    'bad': ['This tenant has a broken batch.', 'Another row of the bad tenant.'],
}


def _nan_loss(inputs, outputs):
    return outputs['logps'].sum() * float('nan')


def _nan_gradient_loss(inputs, outputs):  # finite value (0), NaN gradient: d sqrt(u)/du at u = 0 is inf; inf - inf
    logps = outputs['logps']
    return torch.sqrt((logps - logps).sum())


def _raising_loss(inputs, outputs):
    raise ValueError('reward model unavailable')


def _bad_case(case: str, tokenizer):
    """(rows, loss or None) of the bad tenant, and the stage its rejection must name."""
    rows = text_rows(tokenizer, TEXTS['bad'])
    if case == 'nan_loss':
        return rows, Loss.from_callable(_nan_loss), 'loss'
    if case == 'nan_gradient':
        return rows, Loss.from_callable(_nan_gradient_loss), 'gradient'
    if case == 'nan_weights':  # a NaN per-token weight (like a NaN advantage) at a loss position
        for r in rows:
            r['weights'] = [1.0] * len(r['input_ids'])
            r['weights'][-1] = math.nan
        return rows, None, 'loss'
    if case == 'raising_loss':
        return rows, Loss.from_callable(_raising_loss), 'loss'
    if case == 'token_out_of_vocab':
        rows[1]['input_ids'][2] = 10**6
        return rows, None, 'input'
    if case == 'field_length_mismatch':  # rows that validate but cannot be collated with anybody
        rows[0]['weights'] = [1.0] * len(rows[0]['input_ids'])
        rows[1]['weights'] = [1.0, 2.0]
        return rows, None, 'input'
    raise AssertionError(case)


def _engine(tiny_model_dir, with_bad: bool) -> MultiLoraTransformersModel:
    engine = MultiLoraTransformersModel(tiny_model_dir, device='cpu', pass_strategy='mixed')
    for seed, (name, cfg) in enumerate(GOOD.items()):
        engine.add_adapter_to_model(name, cfg, generator=torch.Generator().manual_seed(seed))
        engine.set_optimizer('AdamW', lr=1e-2, adapter_name=name)
    if with_bad:
        engine.add_adapter_to_model('bad', dict(r=2), generator=torch.Generator().manual_seed(7))
        engine.set_optimizer('AdamW', lr=1e-2, adapter_name='bad')
    return engine


def _snapshot(engine, name):
    weights = {k: v.clone() for k, v in engine.manager.state_dict(name).items()}
    optim = engine.states[name].optimizer.state_dict()['state']
    return weights, {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for i, s in optim.items()}


CASES = ['nan_loss', 'nan_gradient', 'nan_weights', 'raising_loss', 'token_out_of_vocab', 'field_length_mismatch']


@pytest.mark.parametrize('case', CASES)
def test_bad_tenant_is_rejected_and_others_are_bit_identical(tiny_model_dir, tokenizer, case):
    good_rows = {name: text_rows(tokenizer, TEXTS[name]) for name in GOOD}
    bad_rows, bad_loss, stage = _bad_case(case, tokenizer)

    reference = _engine(tiny_model_dir, with_bad=False)
    mixed = _engine(tiny_model_dir, with_bad=True)
    if bad_loss is not None:
        mixed.set_loss(bad_loss, adapter_name='bad')
    bad_before = {k: v.clone() for k, v in mixed.manager.state_dict('bad').items()}

    for _ in range(2):  # two optimizer steps, so Adam moments and step counts are compared too
        reference.forward_backward(inputs=good_rows)
        with pytest.raises(MixedStepError) as info:
            mixed.forward_backward(inputs={**good_rows, 'bad': bad_rows})
        err = info.value
        assert set(err.errors) == {'bad'} and set(err.results) == set(GOOD)
        assert isinstance(err.errors['bad'], TenantStepError) and err.errors['bad'].stage == stage
        assert err.errors['bad'].to_dict()['adapter_name'] == 'bad'
        for name in GOOD:
            reference.clip_grad_and_step(adapter_name=name)
            mixed.clip_grad_and_step(adapter_name=name)

    for name in GOOD:
        (w_ref, o_ref), (w_mix, o_mix) = _snapshot(reference, name), _snapshot(mixed, name)
        assert w_ref.keys() == w_mix.keys()
        for key in w_ref:
            assert torch.equal(w_ref[key], w_mix[key]), f'{name} {key} differs'
        assert o_ref.keys() == o_mix.keys() and len(o_ref) > 0
        for i in o_ref:
            for k, v in o_ref[i].items():
                assert torch.equal(v, o_mix[i][k]) if torch.is_tensor(v) else v == o_mix[i][k], f'{name} {i} {k}'
        m_ref, m_mix = reference.calculate_metric(adapter_name=name), mixed.calculate_metric(adapter_name=name)
        assert m_ref['loss'] == m_mix['loss'] and m_ref['token_accuracy'] == m_mix['token_accuracy']
        assert m_ref['step'] == m_mix['step'] == 2.0
    # the bad tenant's adapter, gradients and metrics are untouched
    for key, value in mixed.manager.state_dict('bad').items():
        assert torch.equal(value, bad_before[key])
    assert all(p.grad is None for p in mixed.manager.parameters('bad'))
    assert 'loss' not in mixed.calculate_metric(adapter_name='bad')


def test_rejected_micro_batch_keeps_earlier_accumulated_gradients(tiny_model_dir, tokenizer):
    engine = _engine(tiny_model_dir, with_bad=False)
    rows = text_rows(tokenizer, TEXTS['alice'])
    engine.forward_backward(inputs=rows, adapter_name='alice')
    before = [p.grad.clone() for p in engine.manager.parameters('alice')]
    engine.set_loss(Loss.from_callable(_nan_gradient_loss), adapter_name='alice')
    with pytest.raises(TenantStepError, match="adapter 'alice': gradient rejected"):
        engine.forward_backward(inputs=rows, adapter_name='alice')  # a single-tenant call raises directly
    for p, g in zip(engine.manager.parameters('alice'), before):
        assert torch.equal(p.grad, g)


def test_return_errors_reports_inline_for_servers(tiny_model_dir, tokenizer):
    engine = _engine(tiny_model_dir, with_bad=False)
    out = engine.forward_only(
        inputs={'alice': text_rows(tokenizer, TEXTS['alice']), 'nobody': [{'input_ids': [1]}]}, return_errors=True
    )
    assert 'loss' in out['alice']
    assert out['nobody']['error']['stage'] == 'input' and 'no adapter named' in out['nobody']['error']['message']
