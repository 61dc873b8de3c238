"""TransformersModel training step: gradients vs a plain transformers+peft loop, padding-free == padded,
logprob alignment, accumulation, metrics hook and clear errors. Tiny fp32 model on CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch
from row_helpers import labelled_rows

from twinkle_core.errors import ComponentNotFoundError, InvalidInputError
from twinkle_core.hooks import hook, register_hooks
from twinkle_core.registry import resolve
from twinkle_transformers.model import TransformersModel

pytestmark = pytest.mark.usefixtures('one_thread')

LORA = {'r': 4, 'lora_alpha': 8, 'init_lora_weights': False}  # random B: every LoRA weight gets a gradient


def lora_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n.replace('.tenant', ''): p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.fixture()
def lora_model(tiny_model_dir):
    torch.manual_seed(0)
    model = TransformersModel(tiny_model_dir)
    model.add_adapter_to_model('tenant', LORA)
    return model


def test_gradients_equal_plain_transformers_peft_loop(lora_model, tiny_model_dir):
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    rows = labelled_rows(1)
    out = lora_model.forward_backward(inputs=rows)

    ref = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
        lora_model.model.peft_config['tenant'],
        adapter_name='tenant',
    )
    set_peft_model_state_dict(
        ref, get_peft_model_state_dict(lora_model.model, adapter_name='tenant'), adapter_name='tenant'
    )
    width = max(len(r['input_ids']) for r in rows)
    ids = torch.tensor([r['input_ids'] + [0] * (width - len(r['input_ids'])) for r in rows])
    labels = torch.tensor([r['labels'] + [-100] * (width - len(r['labels'])) for r in rows])
    mask = torch.tensor([[1] * len(r['input_ids']) + [0] * (width - len(r['input_ids'])) for r in rows])
    ref_loss = ref(input_ids=ids, attention_mask=mask, labels=labels).loss
    ref_loss.backward()

    assert out['loss'] == pytest.approx(ref_loss.item(), abs=1e-6)
    ours, theirs = lora_grads(lora_model.model), lora_grads(ref)
    assert ours.keys() == theirs.keys() and len(ours) > 0
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize('attn', ['twinkle_sdpa', 'sdpa', 'eager'])
def test_padding_free_equals_padded(tiny_model_dir, attn):
    torch.manual_seed(0)
    lora_model = TransformersModel(tiny_model_dir, attn_implementation=attn)
    lora_model.add_adapter_to_model('tenant', LORA)
    assert lora_model.model.config._attn_implementation == attn
    rows = labelled_rows(2)
    padded = lora_model.forward_backward(inputs=rows)
    grads_padded = lora_grads(lora_model.model)
    lora_model.zero_grad()
    lora_model.set_processor('CausalLMProcessor', padding_free=True)
    packed = lora_model.forward_backward(inputs=rows)
    assert packed['loss'] == pytest.approx(padded['loss'], abs=1e-5)
    for name, grad in lora_grads(lora_model.model).items():
        torch.testing.assert_close(grad, grads_padded[name], atol=1e-5, rtol=1e-5, msg=name)
    for a, b in zip(packed['logprobs'], padded['logprobs']):
        assert a == pytest.approx(b, abs=1e-5)


def test_packed_attention_never_crosses_rows_without_processor_hints(lora_model):
    """twinkle_sdpa also splits packed rows found only from restarting position_ids (no cu_seq_lens)."""
    rows = labelled_rows(10)
    assert lora_model.model.config._attn_implementation == 'twinkle_sdpa'
    ids = torch.tensor([[t for r in rows for t in r['input_ids']]])
    pos = torch.tensor([[i for r in rows for i in range(len(r['input_ids']))]])
    with torch.no_grad():
        packed = lora_model.model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        start = 0
        for r in rows:
            alone = lora_model.model(input_ids=torch.tensor([r['input_ids']])).logits[0]
            torch.testing.assert_close(packed[start : start + len(r['input_ids'])], alone, atol=1e-5, rtol=1e-5)
            start += len(r['input_ids'])


def test_logprobs_are_aligned_with_input_ids(lora_model):
    rows = labelled_rows(3)
    out = lora_model.forward_only(inputs=rows)
    with torch.no_grad():
        for row, logprobs in zip(rows, out['logprobs']):
            ids = torch.tensor([row['input_ids']])
            ref = torch.log_softmax(lora_model.model(input_ids=ids).logits[0, :-1].float(), -1)
            ref = ref.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
            assert len(logprobs) == len(row['input_ids']) and logprobs[0] == 0.0
            assert logprobs[1:] == pytest.approx(ref, abs=1e-5)  # prompt tokens included
    train_out = lora_model.forward_backward(inputs=rows)
    for a, b in zip(train_out['logprobs'], out['logprobs']):
        assert a == pytest.approx(b, abs=1e-5)
    assert train_out['loss'] == pytest.approx(out['loss'], abs=1e-6)


def test_gradient_accumulation_matches_one_big_batch(tiny_model_dir):
    rows = labelled_rows(4, lengths=(8, 8, 8, 8))  # equal token counts: mean of means == global mean
    torch.manual_seed(0)
    big = TransformersModel(tiny_model_dir)
    big.add_adapter_to_model('tenant', LORA)
    big.forward_backward(inputs=rows)
    torch.manual_seed(0)
    acc = TransformersModel(tiny_model_dir)
    acc.add_adapter_to_model('tenant', LORA, gradient_accumulation_steps=2)
    acc.set_optimizer('SGD', lr=0.1)
    acc.forward_backward(inputs=rows[:2])
    assert acc.clip_grad_and_step(None)['stepped'] is False  # first micro-step: no optimizer step yet
    acc.forward_backward(inputs=rows[2:])
    grads = lora_grads(acc.model)
    for name, grad in lora_grads(big.model).items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    result = acc.clip_grad_and_step(None)
    assert result['stepped'] is True and result['step'] == 1


def test_training_reduces_loss_and_reports_metrics_through_the_hook(lora_model):
    seen = []

    class Recorder:
        @hook
        def twinkle_metrics(self, step, metrics, context):
            seen.append((step, metrics, context))

    register_hooks(Recorder(), name=f'recorder-{id(seen)}')
    lora_model.set_optimizer('AdamW', lr=1e-2)
    lora_model.set_lr_scheduler('LinearWarmupScheduler', num_warmup_steps=0, num_training_steps=20)
    rows = labelled_rows(5)
    first = lora_model.forward_backward(inputs=rows)['loss']
    lora_model.clip_grad_and_step(1.0)
    for _ in range(7):
        last = lora_model.forward_backward(inputs=rows)['loss']
        lora_model.clip_grad_and_step(1.0)
    assert last < 0.9 * first
    metrics = lora_model.calculate_metric()
    assert {'loss', 'token_accuracy', 'grad_norm', 'lr', 'tokens_per_second'} <= metrics.keys()
    assert metrics['num_tokens'] == 8 * sum(len(r['input_ids']) for r in rows)
    assert 0.0 <= metrics['token_accuracy'] <= 1.0 and math.isfinite(metrics['grad_norm'])
    assert metrics['lr'] == pytest.approx(1e-2 * (1 - 8 / 20))
    assert seen and seen[-1][0] == 8 and seen[-1][1] == metrics and seen[-1][2]['adapter_name'] == 'tenant'


def test_non_finite_gradients_skip_the_step(lora_model):
    lora_model.set_optimizer('AdamW', lr=1e-2)
    before = {n: p.detach().clone() for n, p in lora_model.model.named_parameters() if p.requires_grad}
    lora_model.forward_backward(inputs=labelled_rows(6))
    next(p for p in lora_model.model.parameters() if p.requires_grad).grad.fill_(float('nan'))
    result = lora_model.clip_grad_and_step(1.0)
    assert result['skipped'] and not result['stepped']
    for n, p in lora_model.model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, before[n]) and p.grad is None


def test_full_parameter_training_by_registry_name(tiny_model_dir):
    model = resolve('model', 'TransformersModel', model_id=str(tiny_model_dir), max_length=64)
    model.set_optimizer('AdamW', lr=1e-3)
    rows = labelled_rows(7)
    before = model.model.model.layers[0].mlp.up_proj.weight.detach().clone()
    model.forward_backward(inputs=rows)
    model.clip_grad_and_step(1.0)
    assert not torch.equal(before, model.model.model.layers[0].mlp.up_proj.weight)
    configs = model.get_train_configs()
    assert configs['adapter'] is None and configs['optimizer']['name'] == 'AdamW' and configs['max_length'] == 64


def test_plain_function_loss_and_load_hook(tiny_model_dir):
    loaded = []

    class OnLoad:
        @hook
        def twinkle_model_loaded(self, model, model_id):
            loaded.append((type(model).__name__, model_id))

    register_hooks(OnLoad(), name=f'on-load-{id(loaded)}')
    model = TransformersModel(tiny_model_dir)
    assert loaded == [('Qwen3ForCausalLM', str(tiny_model_dir))]
    model.add_adapter_to_model('tenant', LORA)
    rows = labelled_rows(12)
    model.set_loss('CrossEntropyLoss', reduction='sum')
    expected = model.forward_only(inputs=rows)['loss']
    model.set_loss(lambda inputs, outputs: -(outputs['logps'] * outputs['mask']).sum())
    assert model.forward_backward(inputs=rows)['loss'] == pytest.approx(expected, rel=1e-6)
    assert json.loads(json.dumps(model.get_train_configs()))['adapter']['r'] == LORA['r']


def test_hub_model_ids_resolve_through_the_hub_client(tiny_model_dir, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / 'ms' / 'org' / 'tiny' / 'v1')  # the local stand-in for ModelScope
    monkeypatch.setenv('TWINKLE_HUB_ROOT', str(tmp_path))
    model = TransformersModel('ms://org/tiny@v1')
    assert model.model_dir == str(tmp_path / 'ms' / 'org' / 'tiny' / 'v1') and model.tokenizer is not None
    assert model.get_train_configs()['model_id'] == 'ms://org/tiny@v1'


def test_over_long_row_names_row_length_and_limit(tiny_model_dir):
    model = TransformersModel(tiny_model_dir, max_length=12)
    with pytest.raises(InvalidInputError, match=r'Batch row 1 has 14 tokens, more than the limit of 12'):
        model.forward_backward(inputs=labelled_rows(8, lengths=(9, 14)))


def test_unknown_loss_name_suggests_close_matches(lora_model):
    with pytest.raises(
        ComponentNotFoundError, match=r"(?s)No loss named 'CrossEntropyLos'.*Did you mean.*CrossEntropyLoss"
    ):
        lora_model.set_loss('CrossEntropyLos')
    with pytest.raises(ComponentNotFoundError, match="No loss named 'NoSuchLoss'"):
        lora_model.set_loss('NoSuchLoss')


def test_unknown_adapter_and_missing_optimizer_are_clear_errors(lora_model):
    with pytest.raises(InvalidInputError, match="Unknown adapter 'b'.*adapter 'tenant'"):
        lora_model.forward_backward(inputs=labelled_rows(9), adapter_name='b')
    with pytest.raises(Exception, match=r'call set_optimizer'):  # a scheduler needs the optimizer it drives
        lora_model.set_lr_scheduler('CosineAnnealingLR', T_max=10)
    with pytest.raises(Exception, match=r'call set_optimizer'):
        lora_model.update_optimizer(lr=1e-3)


@pytest.mark.parametrize('adapter, lr', [(False, 1e-5), (True, 1e-4)])
def test_stepping_without_set_optimizer_uses_adamw_and_says_so(tiny_model_dir, caplog, adapter, lr):
    """The Twinkle documents' minimal listing steps without set_optimizer: AdamW with a stated default lr (1e-5
    for all parameters, 1e-4 for an adapter), announced once by a warning, instead of an error."""
    model = TransformersModel(tiny_model_dir)
    if adapter:
        model.add_adapter_to_model('tenant', LORA)
    trained = [p for p in model.model.parameters() if p.requires_grad][-1]
    before = trained.detach().clone()
    with caplog.at_level('WARNING', logger='twinkle_core.train.state'):
        for seed in (1, 2):
            model.forward_backward(inputs=labelled_rows(seed))
            model.clip_grad_and_step()
    warnings = [r.getMessage() for r in caplog.records if 'without set_optimizer' in r.getMessage()]
    assert len(warnings) == 1 and f'AdamW(lr={lr:g})' in warnings[0]
    assert not torch.equal(before, trained)
    configs = model.get_train_configs()
    assert configs['optimizer'] == {'name': 'AdamW', 'kwargs': {'lr': lr}} and configs['optimizer_steps'] == 2


@pytest.mark.gpu
def test_cuda_defaults_to_bf16_and_packing_matches(tiny_model_dir):
    if not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU')
    model = TransformersModel(tiny_model_dir)
    assert model.device.type == 'cuda' and model.dtype == torch.bfloat16
    model.add_adapter_to_model('tenant', LORA)
    rows = labelled_rows(11)
    padded = model.forward_only(inputs=rows)
    model.set_processor('CausalLMProcessor', padding_free=True)
    packed = model.forward_only(inputs=rows)
    assert packed['loss'] == pytest.approx(padded['loss'], rel=2e-2)
    model.set_optimizer('AdamW', lr=1e-3)
    assert math.isfinite(model.forward_backward(inputs=rows)['loss'])
    assert model.clip_grad_and_step(1.0)['stepped']


def test_twinkle_keyword_spellings_of_optimizer_and_scheduler(lora_model, tiny_model_dir):
    """The Twinkle documents call ``set_optimizer(optimizer_cls=...)`` / ``set_lr_scheduler(scheduler_cls=...)``."""
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    lora_model.set_optimizer(optimizer_cls='AdamW', lr=2e-3, weight_decay=0.0)
    lora_model.set_lr_scheduler(scheduler_cls='CosineWarmupScheduler', num_warmup_steps=2, num_training_steps=10)
    state = lora_model._state(None)
    assert isinstance(state.optimizer, torch.optim.AdamW) and state.optimizer.defaults['lr'] == 2e-3
    assert type(state.lr_scheduler).__name__ == 'CosineWarmupScheduler'
    assert lora_model.get_train_configs()['optimizer']['name'] == 'AdamW'
    with pytest.raises(
        TypeError,
        match=r'set_optimizer\(\) takes the component either positionally or as '
        r'optimizer_cls=, exactly once \(both given\)',
    ):
        lora_model.set_optimizer('AdamW', optimizer_cls='SGD', lr=1e-3)
    with pytest.raises(TypeError, match=r'scheduler_cls=, exactly once \(neither given\)'):
        lora_model.set_lr_scheduler(num_warmup_steps=2)
    multi = MultiLoraTransformersModel(tiny_model_dir, device='cpu')
    multi.add_adapter_to_model('a', dict(r=4))
    multi.set_optimizer(optimizer_cls='SGD', lr=0.5, adapter_name='a')
    multi.set_lr_scheduler(scheduler_cls='StepLR', step_size=3, adapter_name='a')
    assert isinstance(multi.states['a'].optimizer, torch.optim.SGD)
    assert isinstance(multi.states['a'].lr_scheduler, torch.optim.lr_scheduler.StepLR)


def test_keywords_nothing_consumes_are_rejected_not_ignored(lora_model, tiny_model_dir):
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    rows = labelled_rows(2)
    lora_model.set_optimizer('AdamW', lr=1e-3)
    with pytest.raises(
        TypeError,
        match=r"forward_backward\(\) got unexpected keyword arguments \['ref_logps'\]; "
        r'it accepts inputs, adapter_name, old_logps, advantages, micro_batch_size',
    ):
        lora_model.forward_backward(inputs=rows, ref_logps=[[0.0]], advantages=[1.0])
    with pytest.raises(TypeError, match=r"forward_only\(\) got unexpected keyword arguments \['temperature'\]"):
        lora_model.forward_only(inputs=rows, temperature=0.7)
    # a row keyword the loss would not read (cross-entropy has no use for advantages)
    with pytest.raises(InvalidInputError, match=r'advantages= is not read by CrossEntropyLoss; set a loss'):
        lora_model.forward_backward(inputs=rows, advantages=[1.0] * len(rows))
    assert all(p.grad is None for p in lora_model.model.parameters() if p.requires_grad)  # nothing ran
    multi = MultiLoraTransformersModel(tiny_model_dir, device='cpu')
    multi.add_adapter_to_model('a', dict(r=4))
    with pytest.raises(InvalidInputError, match=r'old_logps= is not read by CrossEntropyLoss'):
        multi.forward_backward(inputs=rows, adapter_name='a', old_logps=[[0.0]] * len(rows))
    with pytest.raises(
        TypeError,
        match=r"forward_backward\(\) got unexpected keyword arguments \['micro_batch_size'\]"
        r'; it accepts inputs, adapter_name, return_errors',
    ):
        multi.forward_backward(inputs=rows, adapter_name='a', micro_batch_size=2)
    multi.forward(inputs=rows, adapter_name='a')
    with pytest.raises(TypeError, match=r"backward\(\) got unexpected keyword arguments \['retain_graph'\]"):
        multi.backward(retain_graph=True)


def test_calculate_loss_after_forward_only_is_the_evaluation_loss(lora_model, tiny_model_dir):
    """The Twinkle documents' evaluation loop: ``forward_only(inputs=batch); calculate_loss()``."""
    from twinkle_core.errors import TwinkleError
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    rows = labelled_rows(3)
    with pytest.raises(TwinkleError, match='or, for calculate_loss, a forward_only with labels'):
        lora_model.calculate_loss()
    out = lora_model.forward_only(inputs=rows)
    assert lora_model.calculate_loss() == out['loss']
    assert lora_model.calculate_metric(is_training=False)['loss'] == pytest.approx(out['loss'])  # recorded once
    lora_model.forward_only(inputs=rows, compute_loss=False)  # no loss computed: nothing to return
    with pytest.raises(TwinkleError):
        lora_model.calculate_loss()
    lora_model.set_optimizer('AdamW', lr=1e-3)
    lora_model.forward_only(inputs=rows)
    lora_model.forward(inputs=rows)  # a pending training forward wins
    assert lora_model.calculate_loss() == pytest.approx(out['loss'], rel=1e-5)
    lora_model.backward()

    multi = MultiLoraTransformersModel(tiny_model_dir, device='cpu')
    for name in ('a', 'b'):
        multi.add_adapter_to_model(name, dict(r=4))
    got = multi.forward_only(inputs={'a': rows, 'b': rows[:1]})
    assert multi.calculate_loss() == {'a': got['a']['loss'], 'b': got['b']['loss']}


def test_the_twinkle_documents_grpo_keywords(tiny_model_dir):
    """``forward_backward(inputs=rows, old_logps=..., advantages=..., micro_batch_size=...)``: the keywords mean the
    same as the row fields (identical gradients), and micro-batches give the gradients and loss of one pass."""
    from twinkle_core.errors import InvalidInputError

    rows = [{'input_ids': r['input_ids'], 'labels': [-100] * 3 + r['input_ids'][3:]} for r in labelled_rows(4)]
    completion = [len(r['input_ids']) - 3 for r in rows]
    old_logps = [[-1.0 - 0.1 * t for t in range(n)] for n in completion]
    advantages = [1.0, -0.5, 0.25, -1.0]

    def run(inputs, **kwargs):
        torch.manual_seed(0)
        model = TransformersModel(tiny_model_dir)
        model.add_adapter_to_model('tenant', LORA)
        model.set_loss('GRPOLoss')
        out = model.forward_backward(inputs=inputs, **kwargs)
        return out, lora_grads(model.model)

    in_rows = [{**r, 'old_logps': [0.0] * 3 + lp, 'advantage': a} for r, lp, a in zip(rows, old_logps, advantages)]
    want, want_grads = run(in_rows)
    got, got_grads = run(rows, old_logps=old_logps, advantages=advantages)
    assert got['loss'] == want['loss'] and all(torch.equal(got_grads[k], want_grads[k]) for k in want_grads)
    micro, micro_grads = run(rows, old_logps=old_logps, advantages=advantages, micro_batch_size=3)
    assert micro['loss'] == pytest.approx(want['loss'], rel=1e-5) and len(micro['logprobs']) == 4
    for key, grad in want_grads.items():
        torch.testing.assert_close(micro_grads[key], grad, atol=1e-6, rtol=1e-4, msg=key)
    assert any(g.abs().max() > 0 for g in want_grads.values())
    with pytest.raises(InvalidInputError, match='old_logps= has 1 entries for 4 rows'):
        run(rows, old_logps=old_logps[:1])
    with pytest.raises(InvalidInputError, match="row 0 already has 'advantage'"):
        run(in_rows, advantages=advantages)
    with pytest.raises(InvalidInputError, match='micro_batch_size must be an int >= 1'):
        run(rows, micro_batch_size=0)
