"""Adapters come and go at run time (no slot count, memory released); checkpoints are PEFT-compatible both ways
and resume bit-for-bit in a fresh engine under a new name."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch
from test_multi_lora_helpers import peft_state, random_peft_model, text_rows

from twinkle_core.errors import InvalidInputError
from twinkle_transformers.multi_lora import MultiLoraLinear, MultiLoraTransformersModel

TEXTS = ['I am Alice, built by the twinkle team.', 'Alice answers questions about herself.', 'Who are you?']


@pytest.fixture()
def engine(tiny_model_dir):
    return MultiLoraTransformersModel(tiny_model_dir, device='cpu')


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_add_many_heterogeneous_adapters_then_remove_all_releases_memory(engine, tokenizer):
    base_params, base_keys = _num_params(engine.model), set(engine.model.state_dict())
    rows = text_rows(tokenizer, TEXTS[:1])
    optimizers = []
    for i in range(20):  # no slot limit, no maximum rank
        targets = 'all-linear' if i % 2 else ['q_proj', 'o_proj']
        engine.add_adapter_to_model(f't{i}', dict(r=1 + 3 * i, lora_alpha=8, target_modules=targets))
        engine.set_optimizer('AdamW', lr=1e-3, adapter_name=f't{i}')
        optimizers.append(weakref.ref(engine.states[f't{i}'].optimizer))
    engine.forward_backward(inputs={f't{i}': rows for i in range(20)})
    for i in range(20):
        engine.clip_grad_and_step(adapter_name=f't{i}')
    c = engine.model.config  # LoRA parameters: r * (in + out) per adapted Linear, per layer
    h, kv, inter = c.hidden_size, c.num_key_value_heads * c.head_dim, c.intermediate_size
    q, attn = c.num_attention_heads * c.head_dim, (h + c.num_attention_heads * c.head_dim) * 2 + (h + kv) * 2
    per_rank = {'all': attn + 3 * (h + inter), 'q_o': (h + q) * 2}
    expected = sum((1 + 3 * i) * per_rank['all' if i % 2 else 'q_o'] * c.num_hidden_layers for i in range(20))
    assert _num_params(engine.model) - base_params == expected
    for i in range(20):
        engine.remove_adapter(f't{i}')
    gc.collect()
    assert _num_params(engine.model) == base_params
    assert set(engine.model.state_dict()) == base_keys  # wrappers gone: the model is exactly the base again
    assert not any(isinstance(m, MultiLoraLinear) for m in engine.model.modules())
    assert all(ref() is None for ref in optimizers)  # optimizer state freed
    assert engine.list_adapters() == []


def test_removed_adapter_names_and_slots_are_not_confused(engine, tokenizer):
    engine.add_adapter_to_model('a', dict(r=4))
    old_slot = engine.manager.slot('a')
    engine.remove_adapter('a')
    engine.add_adapter_to_model('a', dict(r=8))  # same name again: a new adapter in a new slot
    assert engine.manager.slot('a') != old_slot
    with pytest.raises(InvalidInputError, match='unknown slot'):
        with engine.manager.adapter_indices(torch.tensor([old_slot])):
            pass
    with pytest.raises(KeyError, match="no adapter named 'zed'"):
        engine.remove_adapter('zed')
    with pytest.raises(InvalidInputError, match='already exists'):
        engine.add_adapter_to_model('a', dict(r=2))


def test_saved_adapter_loads_in_plain_peft_with_same_logits(engine, tokenizer, tmp_path, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine.add_adapter_to_model(
        'alice', dict(r=4, lora_alpha=16, init_lora_weights=False, target_modules=['q_proj', 'up_proj'])
    )
    engine.add_adapter_to_model('bob', dict(r=8, init_lora_weights=False))  # all-linear
    ids = torch.tensor([tokenizer(TEXTS[0])['input_ids']])
    for name in ('alice', 'bob'):
        path = engine.save(name, output_dir=str(tmp_path), adapter_name=name)
        peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), path)
        engine.model.eval()
        with torch.no_grad(), engine.manager.use_adapter(name):
            ours = engine.model(input_ids=ids).logits
        torch.testing.assert_close(peft_model(input_ids=ids).logits, ours, atol=1e-5, rtol=1e-5)
        with torch.no_grad():  # and the adapter really changes the output
            assert not torch.allclose(engine.model(input_ids=ids).logits, ours, atol=1e-4)


def test_peft_checkpoint_loads_into_engine(engine, tokenizer, tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = random_peft_model(
        base, dict(r=6, lora_alpha=12, target_modules=['k_proj', 'down_proj'], rank_pattern={'down_proj': 3}), seed=3
    )
    peft_model.save_pretrained(str(tmp_path / 'from_peft'))
    engine.load(str(tmp_path / 'from_peft'), adapter_name='imported')
    ids = torch.tensor([tokenizer(TEXTS[1])['input_ids']])
    engine.model.eval()
    with torch.no_grad(), engine.manager.use_adapter('imported'):
        torch.testing.assert_close(
            engine.model(input_ids=ids).logits, peft_model(input_ids=ids).logits, atol=1e-5, rtol=1e-5
        )
    assert engine.manager.state_dict('imported').keys() == peft_state(peft_model).keys()


def _train(engine, name, rows, steps):
    for _ in range(steps):
        engine.forward_backward(inputs=rows, adapter_name=name)
        engine.clip_grad_and_step(max_norm=1.0, adapter_name=name)


def test_save_then_load_into_fresh_engine_under_new_name_resumes_identically(tiny_model_dir, tokenizer, tmp_path):
    rows = text_rows(tokenizer, TEXTS)
    first = MultiLoraTransformersModel(tiny_model_dir, device='cpu')
    first.add_adapter_to_model('other', dict(r=2))  # slots differ between the two engines on purpose
    first.add_adapter_to_model(
        'alice', dict(r=4, lora_alpha=8), gradient_accumulation_steps=1, generator=torch.Generator().manual_seed(0)
    )
    first.set_optimizer('AdamW', lr=1e-2, adapter_name='alice')
    first.set_lr_scheduler('CosineWarmupScheduler', num_warmup_steps=2, num_training_steps=10, adapter_name='alice')
    _train(first, 'alice', rows, 2)
    path = first.save('ckpt', output_dir=str(tmp_path), save_optimizer=True, adapter_name='alice')
    _train(first, 'alice', rows, 2)

    fresh = MultiLoraTransformersModel(tiny_model_dir, device='cpu')
    fresh.load(path, adapter_name='alice-resumed', load_optimizer=True)
    assert fresh.get_train_configs(adapter_name='alice-resumed')['optimizer_steps'] == 2
    _train(fresh, 'alice-resumed', rows, 2)

    want, got = first.manager.state_dict('alice'), fresh.manager.state_dict('alice-resumed')
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key
    assert fresh.states['alice-resumed'].current_lr() == first.states['alice'].current_lr()


def test_loading_into_an_existing_adapter_with_other_ranks_changes_nothing(engine, tmp_path):
    engine.add_adapter_to_model('small', dict(r=2, init_lora_weights=False))
    engine.add_adapter_to_model('big', dict(r=8))
    path = engine.save('small', output_dir=str(tmp_path), adapter_name='small')
    before = {k: v.clone() for k, v in engine.manager.state_dict('big').items()}
    with pytest.raises(InvalidInputError, match='shape'):
        engine.load(path, adapter_name='big')
    assert all(torch.equal(v, before[k]) for k, v in engine.manager.state_dict('big').items())


def test_train_configs_and_metrics_are_per_adapter(engine, tokenizer):
    engine.add_adapter_to_model('a', dict(r=4))
    engine.add_adapter_to_model('b', dict(r=16, target_modules=['v_proj']), gradient_accumulation_steps=4)
    engine.set_optimizer('AdamW', lr=1e-3, adapter_name='a')
    engine.forward_backward(inputs={'a': text_rows(tokenizer, TEXTS[:2])})
    cfg_a, cfg_b = engine.get_train_configs(adapter_name='a'), engine.get_train_configs(adapter_name='b')
    assert cfg_a['adapter']['r'] == 4 and cfg_b['adapter']['r'] == 16
    assert cfg_b['gradient_accumulation_steps'] == 4 and cfg_a['optimizer']['name'] == 'AdamW'
    assert cfg_b['adapted_modules'] == 4 and cfg_a['adapted_modules'] == 28
    assert json.loads(json.dumps(cfg_a))['adapter']['target_modules'] == 'all-linear'  # JSON-serialisable
    assert 'loss' in engine.calculate_metric(adapter_name='a')
    assert 'loss' not in engine.calculate_metric(adapter_name='b')
    with engine.adapter('b'):
        assert engine.get_train_configs()['adapter_name'] == 'b'
    with pytest.raises(InvalidInputError, match='adapter_name is required'):
        engine.get_train_configs()


def test_transformers_model_checkpoint_resumes_in_the_multi_tenant_engine(tiny_model_dir, tokenizer, tmp_path):
    """A LoRA checkpoint (weights + optimizer) written by the single-adapter TransformersModel continues training
    here exactly as it would there."""
    from twinkle_transformers.model import TransformersModel

    rows = text_rows(tokenizer, TEXTS)
    single = TransformersModel(tiny_model_dir, device='cpu')
    single.add_adapter_to_model(
        'solo', dict(r=4, lora_alpha=8, target_modules=['q_proj', 'v_proj', 'up_proj'], init_lora_weights=False)
    )
    single.set_optimizer('AdamW', lr=1e-2)
    _train(single, None, rows, 1)
    path = single.save('solo', output_dir=str(tmp_path), save_optimizer=True)
    _train(single, None, rows, 2)

    engine = MultiLoraTransformersModel(tiny_model_dir, device='cpu')
    engine.add_adapter_to_model('neighbour', dict(r=2))
    engine.load(path, adapter_name='solo-here', load_optimizer=True)
    _train(engine, 'solo-here', rows, 2)

    from peft import get_peft_model_state_dict

    want = {k: v for k, v in get_peft_model_state_dict(single.model, adapter_name='solo').items()}
    got = engine.manager.state_dict('solo-here')
    assert want.keys() == got.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-6, rtol=1e-5)
