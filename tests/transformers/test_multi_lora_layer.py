"""`MultiLoraLinear` + `MultiLoraManager`: per-token routing is exact, gradients stay per adapter, and the
inference API serves several adapters in one generation batch."""

from __future__ import annotations

import copy

import pytest
import torch
from test_multi_lora_helpers import peft_state, random_peft_model

from twinkle_core.errors import InvalidInputError
from twinkle_transformers.multi_lora import (
    AdapterRouter,
    LoraWeights,
    MultiLoraLinear,
    MultiLoraManager,
    adapter_indices,
)


def _layer_with_adapters(ranks: dict[int, int]):
    torch.manual_seed(0)
    router = AdapterRouter()
    layer = MultiLoraLinear(torch.nn.Linear(16, 12), router)
    for slot, r in ranks.items():
        weights = LoraWeights(16, 12, r, lora_alpha=2 * r, lora_dropout=0.0)
        weights.reset_parameters(init=False)  # random A and B
        layer.add(slot, weights)
    return layer, router


@pytest.mark.parametrize(
    'index',
    [
        [[0, 1, 1, -1, 3, 0, 2], [3, 3, -1, -1, 1, 0, 2]],  # interleaved: gather/scatter
        [[0, 0, 0, 1, 1, 1, 1], [2, 2, 3, 3, 3, -1, -1]],  # tenants one after another (packed layout): views
    ],
    ids=['interleaved', 'contiguous'],
)
def test_per_token_routing_matches_the_explicit_formula_and_gradients_stay_per_adapter(index):
    layer, router = _layer_with_adapters({0: 1, 1: 2, 3: 5})  # slot 2 exists elsewhere but not on this module
    x = torch.randn(2, 7, 16, requires_grad=True)
    index = torch.tensor(index)
    router.set_index(index)
    out = layer(x)
    expected = layer.base_layer(x).detach().clone()
    for b in range(2):
        for t in range(7):
            w = layer.get(int(index[b, t]))
            if w is not None:
                expected[b, t] += (w.lora_B.weight @ (w.lora_A.weight @ x[b, t])) * w.scaling
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)

    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    for slot in (0, 1, 3):
        w = layer.get(slot)
        tokens = index == slot
        xs, gs = x.detach()[tokens], upstream[tokens]  # only this adapter's tokens
        grad_b = w.scaling * gs.T @ (xs @ w.lora_A.weight.T)
        grad_a = w.scaling * (gs @ w.lora_B.weight).T @ xs
        torch.testing.assert_close(w.lora_B.weight.grad, grad_b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(w.lora_A.weight.grad, grad_a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    'index',
    [
        [[0, 0, 0, 1, 1, 1, 1], [3, 3, 3, 3, 2, 2, 2]],  # tenants one after another: in-place adds on views
        [[-1, 0, 0, 1, 1, 1, 1], [3, 3, 3, 3, 2, 2, -1]],  # base-only head and tail around the adapter tokens
        [[0, 1, 1, -1, 3, 0, 2], [3, 3, -1, -1, 1, 0, 2]],  # interleaved: gather + scatter-add
    ],
    ids=['contiguous', 'contiguous_with_base_rows', 'interleaved'],
)
@pytest.mark.parametrize('dropout', [0.0, 0.1], ids=['segmented_node', 'plain_autograd_with_dropout'])
def test_each_adapters_output_and_gradients_are_bit_identical_to_its_solo_run(index, dropout):
    """The mixed layer (one autograd node for every adapter, or plain autograd when a dropout is active) gives
    every adapter exactly the output and A/B gradients of running that adapter alone on its tokens. (Only the
    base layer's own output may differ from a solo run in the last bits: a matmul over more rows.)"""
    layer, router = _layer_with_adapters({0: 1, 1: 2, 3: 5})  # slot 2 is not on this module: base output
    for w in layer.adapters.values():
        w.dropout = torch.nn.Dropout(dropout) if dropout else torch.nn.Identity()
    solos = {slot: copy.deepcopy(layer.get(slot)) for slot in (0, 1, 3)}
    x = torch.randn(2, 7, 16, requires_grad=True)
    index = torch.tensor(index)
    router.set_index(index)
    torch.manual_seed(5)  # dropout masks: drawn per adapter in slot order, like the solo runs below
    out = layer(x)
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    grad_x = x.grad.clone()
    flat_index, flat_x, flat_up = index.reshape(-1), x.detach().reshape(-1, 16), upstream.reshape(-1, 12)
    base = layer.base_layer(x).detach().reshape(-1, 12)  # the same base rows the layer computed
    expected_grad_x = flat_up @ layer.base_layer.weight
    torch.manual_seed(5)
    for slot, solo in solos.items():
        w = layer.get(slot)
        rows = (flat_index == slot).nonzero().squeeze(1)
        xs = flat_x[rows].clone().requires_grad_(True)
        delta = solo(xs)
        assert torch.equal(out.detach().reshape(-1, 12)[rows], base[rows] + delta.detach()), slot
        (delta * flat_up[rows]).sum().backward()
        assert torch.equal(w.lora_A.weight.grad, solo.lora_A.weight.grad), slot
        assert torch.equal(w.lora_B.weight.grad, solo.lora_B.weight.grad), slot
        expected_grad_x[rows] += xs.grad
    untouched = (flat_index == -1) | (flat_index == 2)
    assert torch.equal(out.detach().reshape(-1, 12)[untouched], base[untouched])
    torch.testing.assert_close(grad_x.reshape(-1, 16), expected_grad_x, atol=1e-6, rtol=1e-6)


def test_uniform_routing_and_base_only_tokens():
    layer, router = _layer_with_adapters({0: 2, 1: 3})
    x = torch.randn(3, 4, 16)
    base = layer.base_layer(x)
    torch.testing.assert_close(layer(x), base)  # no routing set: base model
    router.set_index(torch.full((3,), -1))
    torch.testing.assert_close(layer(x), base)
    router.set_uniform(1)
    w = layer.get(1)
    torch.testing.assert_close(layer(x), base + w(x))
    router.set_index(torch.tensor([1, 1, 1]))  # per-row index covering every token: same result
    torch.testing.assert_close(layer(x), base + w(x))


def test_routing_errors_say_what_to_fix(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    manager = MultiLoraManager.attach(model)
    manager.add_adapter('a', {'r': 2, 'target_modules': ['q_proj']})
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r'does not match activations with leading shape \(2, 5\)'):
        with manager.adapter_indices(torch.zeros(3, dtype=torch.long)):
            model(input_ids=ids)
    with pytest.raises(TypeError, match='integer torch.Tensor'):
        with manager.adapter_indices(torch.zeros(2)):
            pass
    with pytest.raises(InvalidInputError, match=r'unknown slot\(s\) \[7\]'):
        with manager.adapter_indices(torch.tensor([0, 7])):
            pass
    with pytest.raises(KeyError, match="no adapter named 'b'"):
        manager.index_tensor(['a', 'b'])
    with pytest.raises(InvalidInputError, match='matches no Linear module'):
        manager.add_adapter('c', {'target_modules': ['nonexistent_proj']})
    with pytest.raises(InvalidInputError, match='use_dora'):
        manager.add_adapter('d', {'target_modules': ['q_proj'], 'use_dora': True})
    assert manager.adapter_names == ['a']  # failed adds left nothing behind


def test_generation_batch_with_a_different_adapter_per_row_matches_peft(tiny_model_dir):
    """The sampler's use: one `generate` over rows that each use another adapter (or none)."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    configs = {
        'alice': dict(r=4, lora_alpha=16, target_modules='all-linear'),
        'bob': dict(r=12, lora_alpha=8, target_modules=['q_proj', 'v_proj', 'gate_proj']),
    }
    references = {name: random_peft_model(base, cfg, seed=i).eval() for i, (name, cfg) in enumerate(configs.items())}
    model = copy.deepcopy(base)
    manager = MultiLoraManager.attach(model)
    for name, cfg in configs.items():
        manager.add_adapter(name, cfg, state_dict=peft_state(references[name]))
    prompts = torch.tensor([[5, 17, 42, 9], [5, 17, 42, 9], [8, 3, 11, 250]])
    names = ['alice', 'bob', None]
    gen = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad(), adapter_indices(model, manager.index_tensor(names)):
        together = model.generate(prompts, attention_mask=torch.ones_like(prompts), **gen)
    for row, name in enumerate(names):
        alone_model = references[name] if name else base
        with torch.no_grad():
            alone = alone_model.generate(
                input_ids=prompts[row : row + 1], attention_mask=torch.ones(1, 4, dtype=torch.long), **gen
            )
        assert together[row].tolist() == alone[0].tolist(), name
    assert together[0].tolist() != together[1].tolist()  # the adapters really differ


def test_half_precision_base_keeps_float32_adapters(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    manager = MultiLoraManager.attach(model)
    manager.add_adapter('a', {'r': 4, 'target_modules': 'all-linear'})
    assert {p.dtype for p in manager.parameters('a')} == {torch.float32}
    with manager.use_adapter('a'):
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.dtype == torch.bfloat16


@pytest.mark.parametrize(
    'config',
    [
        dict(r=8, lora_alpha=16, target_modules='all-linear'),
        dict(r=4, target_modules=['k_proj', 'down_proj'], init_lora_weights='gaussian'),
    ],
)
def test_initial_weights_are_peft_initial_weights_for_the_same_seed(tiny_model_dir, config):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(123)
    reference = peft_state(get_peft_model(copy.deepcopy(base), LoraConfig(**config)))
    manager = MultiLoraManager.attach(copy.deepcopy(base))
    torch.manual_seed(123)
    manager.add_adapter('a', config)
    ours = manager.state_dict('a')
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[k], reference[k]) for k in reference)
