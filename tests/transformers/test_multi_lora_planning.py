"""The engine splits a multi-tenant step into the passes its `PassPlanner` chooses, and every split gives each
tenant the result it gets alone: one-by-one is bit-identical to calling each tenant separately; groups and capped
passes agree with one mixed pass within float tolerance (a different batch size changes the base model's matmul
blocking, not the math)."""

from __future__ import annotations

import pytest
import torch
from test_multi_lora_helpers import text_rows

from twinkle_transformers.multi_lora import MultiLoraTransformersModel

pytestmark = pytest.mark.usefixtures('one_thread')

TENANTS = {
    'alice': dict(r=4, lora_alpha=8, init_lora_weights=False),
    'bob': dict(r=8, lora_alpha=16, target_modules=['q_proj', 'v_proj'], init_lora_weights=False),
    'carol': dict(r=8, lora_alpha=8, init_lora_weights=False),
}
TEXTS = {
    'alice': ['I am Alice, built by the twinkle team.', 'Alice answers questions.'],
    'bob': ['Bob talks about the weather.', 'Bob says hello to you.', 'And a third row from Bob.'],
    'carol': ['Carol has one longer row of text to train on, longer than the others by far.'],
}


def _engine(tiny_model_dir, optimizer: str = 'AdamW', **kwargs) -> MultiLoraTransformersModel:
    engine = MultiLoraTransformersModel(tiny_model_dir, device='cpu', **kwargs)
    for seed, (name, cfg) in enumerate(TENANTS.items()):
        engine.add_adapter_to_model(name, cfg, generator=torch.Generator().manual_seed(seed))
        engine.set_optimizer(optimizer, lr=1e-2, adapter_name=name)
    return engine


def _grads(engine, name):
    return {k: p.grad.clone() for k, p in engine.manager.named_parameters(name)}


@pytest.fixture()
def rows(tokenizer):
    return {name: text_rows(tokenizer, texts) for name, texts in TEXTS.items()}


def test_one_by_one_is_bit_identical_to_calling_each_tenant_alone(tiny_model_dir, rows):
    planned, alone = _engine(tiny_model_dir, pass_strategy='one_by_one'), _engine(tiny_model_dir)
    for _ in range(2):
        out = planned.forward_backward(inputs=rows)
        for name in rows:
            ref = alone.forward_backward(inputs=rows[name], adapter_name=name)
            assert out[name]['loss'] == ref['loss'] and out[name]['logprobs'] == ref['logprobs'], name
            got, want = _grads(planned, name), _grads(alone, name)
            assert all(torch.equal(got[k], want[k]) for k in want), name
            planned.clip_grad_and_step(adapter_name=name)
            alone.clip_grad_and_step(adapter_name=name)
    assert planned.planner.stats['one_by_one'] == 2 and planned.planner.stats['passes'] == 6


@pytest.mark.parametrize(
    'kwargs', [dict(), dict(pass_strategy='mixed', max_pass_tokens=64)], ids=['auto', 'mixed_capped']
)
def test_planned_passes_agree_with_one_mixed_pass(tiny_model_dir, rows, kwargs):
    """SGD, not Adam, between the compared steps: Adam's update of a near-zero gradient is about lr * sign(g), so
    last-bit differences of the base matmuls (measured: on AVX-512 CPUs) grow into 1e-4 logprob differences
    after three steps; SGD keeps each step's difference at lr times the gradient's. Gradients are compared
    relative to their tensor's norm (1e-4): a near-zero element's relative error says nothing."""
    planned = _engine(tiny_model_dir, optimizer='SGD', **kwargs)
    mixed = _engine(tiny_model_dir, optimizer='SGD', pass_strategy='mixed', max_pass_tokens=None)
    for step in range(4):  # 'auto' explores: one by one, then larger passes
        out, ref = planned.forward_backward(inputs=rows), mixed.forward_backward(inputs=rows)
        for name in rows:
            assert out[name]['loss'] == pytest.approx(ref[name]['loss'], rel=1e-5, abs=1e-6), (step, name)
            for got, want in zip(out[name]['logprobs'], ref[name]['logprobs']):
                torch.testing.assert_close(
                    torch.tensor(got),
                    torch.tensor(want),
                    atol=1e-5,
                    rtol=1e-5,
                    msg=lambda m, step=step, name=name: f'{step} {name}: {m}',
                )
            got, want = _grads(planned, name), _grads(mixed, name)
            for key in want:
                diff, scale = (got[key] - want[key]).norm(), want[key].norm()  # relative to the tensor's norm
                assert diff <= 1e-4 * scale + 1e-8, f'{step} {name} {key}: |diff| {diff:.3g} vs |grad| {scale:.3g}'
            planned.clip_grad_and_step(adapter_name=name)
            mixed.clip_grad_and_step(adapter_name=name)
    stats = planned.planner.stats
    assert stats['mixed'] + stats['groups'] + stats['one_by_one'] == 4
    if kwargs:  # 2 + 3 + 1 rows padded to the longest would be > 64 tokens: never one pass
        assert stats['mixed'] == 0 and stats['passes'] >= 8
    else:  # it starts from the one-by-one baseline, measuring it
        assert stats['one_by_one'] >= 1 and stats['exploring'] >= 1


def test_forward_only_and_split_calls_follow_the_plan(tiny_model_dir, rows):
    capped = _engine(tiny_model_dir, pass_strategy='mixed', max_pass_tokens=64)
    mixed = _engine(tiny_model_dir, pass_strategy='mixed', max_pass_tokens=None)
    got, want = capped.forward_only(inputs=rows), mixed.forward_only(inputs=rows)
    for name in rows:
        assert got[name]['loss'] == pytest.approx(want[name]['loss'], rel=1e-5)
    capped.forward(inputs=rows)
    assert len(capped._pending.passes) > 1  # the split API keeps one pending pass per planned pass
    losses = capped.calculate_loss()
    out = capped.backward()
    for name in rows:
        assert losses[name] == out[name]['loss'] == pytest.approx(want[name]['loss'], rel=1e-5)
        assert all(p.grad is not None for p in capped.manager.parameters(name))


def test_server_engine_plans_the_passes_of_queued_work(tiny_model_dir, rows):
    from twinkle_server.engine.model_host import TrainBatch, load_model_host

    engine = load_model_host('tiny', str(tiny_model_dir), device='cpu', backend_args={'pass_strategy': 'one_by_one'})
    for name, cfg in TENANTS.items():
        engine.model.add_adapter_to_model(name, cfg)
        engine.model.set_optimizer('AdamW', lr=1e-3, adapter_name=name)
    results = engine.forward_backward(
        [TrainBatch(name, rows[name], 'CrossEntropyLoss', {'reduction': 'sum'}) for name in rows]
    )
    assert all(not isinstance(r, BaseException) for r in results)
    assert engine.pass_stats()['one_by_one'] == 1 and engine.pass_stats()['passes'] == 3
    with pytest.raises(ValueError, match="unknown pass strategy 'fast'"):
        load_model_host('tiny', str(tiny_model_dir), device='cpu', backend_args={'pass_strategy': 'fast'})
