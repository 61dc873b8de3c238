"""One tenant's call above the pass cap (`max_pass_tokens`) runs in pieces, with the result of one pass: the same
loss, log-probs, metrics and gradients; all or nothing when a piece is rejected; and other tenants of the call
untouched. Losses that couple rows (DPO pairs) keep a call whole."""

from __future__ import annotations

import math

import pytest
import torch
from test_multi_lora_helpers import text_rows

from twinkle_transformers.multi_lora import MultiLoraTransformersModel, TenantStepError
from twinkle_transformers.multi_lora.mixed_pass import TenantWork
from twinkle_transformers.multi_lora.tenant_split import split_rows

TEXTS = [
    'I am Alice, built by the twinkle team.',
    'Alice answers questions about trains.',
    'A much longer row of the same tenant, so that rows differ in length and in loss tokens.',
    'Short.',
    'The fifth row talks about the weather in the mountains.',
    'And a sixth one, to make three pieces of two.',
]
TOLERANCE = 1e-5  # float32 sums over the pieces in another order


def _engine(tiny_model_dir, **kwargs) -> MultiLoraTransformersModel:
    engine = MultiLoraTransformersModel(tiny_model_dir, device='cpu', pass_strategy='mixed', **kwargs)
    for seed, name in enumerate(('alice', 'bob')):
        engine.add_adapter_to_model(name, dict(r=4, lora_alpha=8), generator=torch.Generator().manual_seed(seed))
        engine.set_optimizer('AdamW', lr=1e-2, adapter_name=name)
    return engine


def _grads(engine, name):
    return [p.grad.clone() for p in engine.manager.parameters(name)]


def _rl_rows(tokenizer, advantages):
    rows = text_rows(tokenizer, TEXTS)
    for row, advantage in zip(rows, advantages):
        row['old_logps'] = [0.0] * 3 + [-1.0] * (len(row['input_ids']) - 3)
        row['advantage'] = advantage
    return rows


@pytest.mark.parametrize(
    'loss, kwargs',
    [
        ('CrossEntropyLoss', {}),
        ('CrossEntropyLoss', {'reduction': 'sequence_mean'}),
        ('GRPOLoss', {}),
        ('PPOClipLoss', {}),
    ],
)
@pytest.mark.parametrize('padding_free', [False, True])
def test_a_call_above_the_cap_equals_one_pass(tiny_model_dir, tokenizer, loss, kwargs, padding_free):
    whole, split = _engine(tiny_model_dir, max_pass_tokens=None), _engine(tiny_model_dir, max_pass_tokens=40)
    rows = _rl_rows(tokenizer, [1.0, -0.5, 0.25, 2.0, -1.0, 0.5]) if loss != 'CrossEntropyLoss' else None
    rows = rows or text_rows(tokenizer, TEXTS)
    for engine in (whole, split):
        engine.set_loss(loss, adapter_name='alice', **kwargs)
        engine.set_processor('CausalLMProcessor', adapter_name='alice', padding_free=padding_free)
    assert split_rows(TenantWork('alice', split.states['alice'], rows), 40, packed=padding_free) is not None

    ref, out = (
        whole.forward_backward(inputs=rows, adapter_name='alice'),
        split.forward_backward(inputs=rows, adapter_name='alice'),
    )

    assert out['loss'] == pytest.approx(ref['loss'], abs=TOLERANCE)
    assert len(out['logprobs']) == len(rows)
    for a, b in zip(out['logprobs'], ref['logprobs']):
        assert a == pytest.approx(b, abs=TOLERANCE)
    for g, r in zip(_grads(split, 'alice'), _grads(whole, 'alice')):
        torch.testing.assert_close(g, r, atol=TOLERANCE, rtol=1e-4)
    m_split, m_whole = split.calculate_metric(adapter_name='alice'), whole.calculate_metric(adapter_name='alice')
    assert m_split['loss'] == pytest.approx(m_whole['loss'], abs=TOLERANCE)
    assert m_split['num_tokens'] == m_whole['num_tokens']
    assert split.model_info()['pass_stats']['split_calls'] == 1 and whole.model_info()['pass_stats']['split_calls'] == 0


def test_a_rejected_piece_rejects_the_whole_call_and_keeps_earlier_gradients(tiny_model_dir, tokenizer):
    engine = _engine(tiny_model_dir, max_pass_tokens=40)
    engine.set_loss('GRPOLoss', adapter_name='alice')
    engine.forward_backward(inputs=_rl_rows(tokenizer, [1.0] * 6)[:2], adapter_name='alice')  # one pass: accumulated
    before = _grads(engine, 'alice')
    engine.calculate_metric(adapter_name='alice')  # empty the metrics window

    bad = _rl_rows(tokenizer, [1.0, -1.0, 0.5, 0.5, math.nan, 1.0])  # the NaN is in the last piece
    expected = r"'advantage' of row 0 is nan.* the piece of rows 4-\d+; row numbers above count from 4"
    with pytest.raises(TenantStepError, match=rf"adapter 'alice': loss rejected: .*{expected}"):
        engine.forward_backward(inputs=bad, adapter_name='alice')

    for p, g in zip(engine.manager.parameters('alice'), before):
        assert torch.equal(p.grad, g)  # the first pieces' gradients were dropped
    assert 'loss' not in engine.calculate_metric(adapter_name='alice')  # nor their metrics recorded


def test_other_tenants_of_a_mixed_call_are_unaffected_by_a_split(tiny_model_dir, tokenizer):
    whole, split = _engine(tiny_model_dir, max_pass_tokens=None), _engine(tiny_model_dir, max_pass_tokens=40)
    inputs = {'alice': text_rows(tokenizer, TEXTS), 'bob': text_rows(tokenizer, TEXTS[3:4])}
    ref, out = whole.forward_backward(inputs=inputs), split.forward_backward(inputs=inputs)
    for name in inputs:
        assert out[name]['loss'] == pytest.approx(ref[name]['loss'], abs=TOLERANCE)
        for g, r in zip(_grads(split, name), _grads(whole, name)):
            torch.testing.assert_close(g, r, atol=TOLERANCE, rtol=1e-4)


def test_losses_that_couple_rows_keep_the_call_whole(tiny_model_dir, tokenizer):
    engine = _engine(tiny_model_dir, max_pass_tokens=40)
    engine.set_loss('DPOLoss', adapter_name='alice')
    rows = text_rows(tokenizer, TEXTS)
    assert split_rows(TenantWork('alice', engine.states['alice'], rows), 40, packed=False) is None
    logprobs_only = TenantWork('alice', engine.states['alice'], rows, compute_loss=False)
    assert split_rows(logprobs_only, 40, packed=False) is not None  # a forward without a loss always splits


@pytest.mark.parametrize('compute_loss', [True, False])
def test_a_forward_only_above_the_cap_equals_one_pass(tiny_model_dir, tokenizer, compute_loss):
    whole, split = _engine(tiny_model_dir, max_pass_tokens=None), _engine(tiny_model_dir, max_pass_tokens=40)
    rows = text_rows(tokenizer, TEXTS)
    ref = whole.forward_only(inputs=rows, adapter_name='alice', compute_loss=compute_loss)
    out = split.forward_only(inputs=rows, adapter_name='alice', compute_loss=compute_loss)
    assert ('loss' in out) == ('loss' in ref) == compute_loss
    if compute_loss:
        assert out['loss'] == pytest.approx(ref['loss'], abs=TOLERANCE)
    for a, b in zip(out['logprobs'], ref['logprobs'], strict=True):
        assert a == pytest.approx(b, abs=TOLERANCE)
    assert split.model_info()['pass_stats']['split_calls'] == 1
