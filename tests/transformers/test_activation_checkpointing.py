"""Activation checkpointing (`gradient_checkpointing=`) on TransformersModel and MultiLoraTransformersModel: the
chosen blocks really recompute in backward, keep fewer activations, and the gradients equal the plain run's
(1e-6, fp32) -- full-parameter and LoRA, padded and padding-free, one tenant and the multi-tenant mixed pass.
Mesh dimensions the backend does not implement are refused at construction, naming the dimension."""

from __future__ import annotations

import pytest
import torch
from row_helpers import labelled_rows

from twinkle_core.errors import InvalidInputError, MeshError
from twinkle_core.mesh import DeviceMesh
from twinkle_transformers.model import TransformersModel
from twinkle_transformers.multi_lora import MultiLoraTransformersModel

pytestmark = pytest.mark.usefixtures('one_thread')
TOL = 1e-6
LORA = {'r': 4, 'lora_alpha': 8, 'target_modules': 'all-linear', 'init_lora_weights': False}
POLICIES = {'every_layer': True, 'every_2nd': 2, 'selective': 'selective', 'layer_1': {'layers': [1]}}


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys() and got
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=TOL, rtol=TOL, msg=name)


def lora_step(tiny_model_dir, padding_free: bool, **kwargs) -> tuple[TransformersModel, dict, float]:
    model = TransformersModel(tiny_model_dir, **kwargs)
    torch.manual_seed(0)  # the same random A and B in every run
    model.add_adapter_to_model('default', LORA)
    if padding_free:
        model.set_processor('CausalLMProcessor', padding_free=True)
    loss = model.forward_backward(inputs=labelled_rows(0))['loss']
    return model, grads(model.model), loss


def count_calls(module: torch.nn.Module) -> list[int]:
    """Calls of `module` (a pre-hook: a recomputation stops as soon as it has what backward needs)."""
    calls = [0]
    module.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize('padding_free', [False, True], ids=['padded', 'packed'])
@pytest.mark.parametrize('policy', sorted(POLICIES))
def test_lora_gradients_equal_the_plain_run(tiny_model_dir, policy, padding_free) -> None:
    _, want, want_loss = lora_step(tiny_model_dir, padding_free)
    model, got, loss = lora_step(tiny_model_dir, padding_free, gradient_checkpointing=POLICIES[policy])
    assert loss == pytest.approx(want_loss, abs=TOL)
    assert_same_grads(got, want)
    layers = model.model.get_decoder().layers
    expected = {'every_layer': list(range(len(layers))), 'layer_1': [1]}.get(policy)
    expected = expected or (list(range(0, len(layers), 2)) if policy == 'every_2nd' else list(range(len(layers))))
    assert model.checkpointed_layers == expected


def test_checkpointed_layers_recompute_in_backward_and_keep_fewer_activations(tiny_model_dir) -> None:
    def saved_bytes(model: TransformersModel) -> tuple[int, int]:
        mlp_calls = count_calls(model.model.get_decoder().layers[0].mlp)
        total = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.forward_backward(inputs=labelled_rows(1, lengths=(64, 64)))
        return total[0], mlp_calls[0]

    plain_bytes, plain_calls = saved_bytes(TransformersModel(tiny_model_dir))
    ckpt_bytes, ckpt_calls = saved_bytes(TransformersModel(tiny_model_dir, gradient_checkpointing=True))
    assert (plain_calls, ckpt_calls) == (1, 2)  # the forward, and its recomputation in backward
    assert ckpt_bytes < plain_bytes / 2
    model = TransformersModel(tiny_model_dir, gradient_checkpointing=True)
    calls = count_calls(model.model.get_decoder().layers[0].mlp)
    model.forward_only(inputs=labelled_rows(1))
    assert calls[0] == 1  # without gradients nothing is recomputed


def test_full_parameter_gradients_equal_the_plain_run(tiny_model_dir) -> None:
    def step(**kwargs) -> dict[str, torch.Tensor]:
        model = TransformersModel(tiny_model_dir, **kwargs)
        model.forward_backward(inputs=labelled_rows(2))
        return grads(model.model)

    assert_same_grads(step(gradient_checkpointing={'every': 2, 'selective': True}), step())


TENANTS = {'alice': dict(r=4, lora_alpha=8), 'bob': dict(r=8, lora_alpha=16, target_modules=['q_proj', 'v_proj'])}


def mixed_step(tiny_model_dir, padding_free: bool, **kwargs) -> tuple[dict[str, dict[str, torch.Tensor]], tuple]:
    """Per-tenant gradients of one mixed pass, and how often layer 0's attention and MLP ran."""
    engine = MultiLoraTransformersModel(tiny_model_dir, device='cpu', pass_strategy='mixed', **kwargs)
    layer = engine.model.get_decoder().layers[0]
    attn_calls, mlp_calls = count_calls(layer.self_attn.q_proj), count_calls(layer.mlp)
    for seed, (name, cfg) in enumerate(TENANTS.items()):
        engine.add_adapter_to_model(name, cfg, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():  # a non-zero B: gradients reach A too
            for param in engine.manager.parameters(name):
                param.add_(0.01 * torch.randn(param.shape, generator=torch.Generator().manual_seed(seed)))
        if padding_free:
            engine.set_processor('CausalLMProcessor', padding_free=True, adapter_name=name)
    engine.forward_backward(inputs={'alice': labelled_rows(3), 'bob': labelled_rows(4, lengths=(7, 20))})
    out = {}
    for name in TENANTS:
        out[name] = {str(i): p.grad.detach().clone() for i, p in enumerate(engine.manager.parameters(name))}
    return out, (attn_calls[0], mlp_calls[0])


@pytest.mark.parametrize('padding_free', [False, True], ids=['padded', 'packed'])
def test_multi_tenant_mixed_pass_gradients_equal_the_plain_run(tiny_model_dir, padding_free) -> None:
    want, calls = mixed_step(tiny_model_dir, padding_free)
    assert calls == (1, 1)  # one shared pass
    for policy, recomputed in ((True, (2, 2)), ('selective', (2, 1))):
        got, calls = mixed_step(tiny_model_dir, padding_free, gradient_checkpointing=policy)
        assert calls == recomputed, policy
        for name in TENANTS:
            assert_same_grads(got[name], want[name])


def test_bad_policies_are_refused(tiny_model_dir) -> None:
    with pytest.raises(InvalidInputError, match='gradient_checkpointing must be True, False'):
        TransformersModel(tiny_model_dir, gradient_checkpointing='sometimes')
    with pytest.raises(InvalidInputError, match=r'layers \[9\] do not exist \(the model has 4 layers\)'):
        TransformersModel(tiny_model_dir, gradient_checkpointing={'layers': [9]})
    with pytest.raises(InvalidInputError, match='unknown keys'):
        MultiLoraTransformersModel(tiny_model_dir, device='cpu', gradient_checkpointing={'each': 2})


def test_unimplemented_mesh_dimensions_are_refused(tiny_model_dir) -> None:
    mesh = DeviceMesh.from_sizes(device_type='cpu', pp_size=2)
    message = r'pp_size=2 \(pipeline parallel\) is not implemented by TransformersModel'
    with pytest.raises(MeshError, match=message + r' \(it implements: dp_size, fsdp_size, tp_size, cp_size, ep_size\)'):
        TransformersModel(tiny_model_dir, device_mesh=mesh)


@pytest.mark.slow
def test_checkpointing_inside_compiled_layers(tiny_model_dir) -> None:
    """compile_layers (aot_eager: traced, no code generation) with every layer checkpointed: the same gradients."""
    _, want, _ = lora_step(tiny_model_dir, False)
    model, got, _ = lora_step(tiny_model_dir, False, compile_layers='aot_eager', gradient_checkpointing=True)
    assert model.compile_backend == 'aot_eager' and model.checkpointed_layers == [0, 1, 2, 3]
    assert_same_grads(got, want)
