"""Liger for CUDA models (twinkle_transformers.liger): refused on CPU models before anything changes (here), and
on a GPU -- `gpu` marker, liger-kernel installed -- the kernelized tiny Qwen3 and the fused linear cross-entropy
loss give the same losses and gradients as the plain model (fp32, stated tolerances: Triton reduces in another
order), while a CPU model in the same process keeps working."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.kernel import apply_kernels
from twinkle_core.registry import resolve

LIGER_KERNELS = ['LigerRMSNorm', 'LigerSwiGLUMLP']
ROWS = [
    {'input_ids': [5, 6, 7, 8, 9, 10, 11, 12], 'labels': [-100, -100, 7, 8, 9, 10, 11, 12]},
    {'input_ids': [100, 200, 300, 400, 500], 'labels': [-100, 200, 300, 400, 500]},
]


def test_liger_is_refused_on_cpu_models_before_anything_changes(tiny_model_dir):
    model = resolve('model', 'TransformersModel', model_id=str(tiny_model_dir), device='cpu')
    with pytest.raises(InvalidInputError, match="'LigerRMSNorm' does not run on 'cpu'"):
        apply_kernels(model.model, LIGER_KERNELS, device='cpu')
    assert not any('forward' in m.__dict__ for m in model.model.modules())
    with pytest.raises(InvalidInputError, match="does not run on 'cpu'"):
        resolve('model', 'TransformersModel', model_id=str(tiny_model_dir), device='cpu', kernels=['LigerSwiGLUMLP'])
    model.set_loss('LigerFusedLinearCrossEntropyLoss')
    with pytest.raises(InvalidInputError, match='runs on CUDA models only .* ChunkedCrossEntropyLoss'):
        model.forward_backward(inputs=ROWS)


def _model(model_dir, **kwargs):
    model = resolve('model', 'TransformersModel', model_id=str(model_dir), device='cuda', dtype='float32', **kwargs)
    model.add_adapter_to_model('default', {'r': 8, 'lora_alpha': 16, 'target_modules': 'all-linear'})
    return model


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.model.named_parameters() if p.grad is not None}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
@pytest.mark.skipif(
    importlib.util.find_spec('liger_kernel') is None, reason='pip install "twinkle-transformers[liger]"'
)
@pytest.mark.parametrize('loss', ['CrossEntropyLoss', 'LigerFusedLinearCrossEntropyLoss'])
def test_liger_kernels_and_loss_match_the_plain_model_on_cuda(tiny_model_dir, loss):
    torch.manual_seed(0)
    plain = _model(tiny_model_dir)
    torch.manual_seed(0)
    liger = _model(tiny_model_dir, kernels=LIGER_KERNELS)
    layers = liger.model.config.num_hidden_layers
    assert liger.kernels == {'LigerRMSNorm': 4 * layers + 1, 'LigerSwiGLUMLP': layers}
    liger.set_loss(loss)
    want, got = plain.forward_backward(inputs=ROWS), liger.forward_backward(inputs=ROWS)
    assert got['loss'] == pytest.approx(want['loss'], rel=1e-5)
    reference = _grads(plain)
    assert reference.keys() == _grads(liger).keys()
    for name, grad in _grads(liger).items():
        torch.testing.assert_close(grad, reference[name], atol=1e-5, rtol=1e-4, msg=name)
    # instance-level only: a CPU model in the same process still runs (liger's class patches were never applied)
    cpu = resolve('model', 'TransformersModel', model_id=str(tiny_model_dir), device='cpu')
    assert torch.isfinite(torch.tensor(cpu.forward_only(inputs=ROWS)['loss']))
