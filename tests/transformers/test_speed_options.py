"""TransformersModel's speed options on CPU: regional compilation (`compile_layers`), bf16 autocast over fp32
master weights (`mixed_precision`), fused AdamW by default on CUDA only, and no host sync between a step's forward
and its backward. The GPU figures are `bench/mfu_ladder.py`'s."""

from __future__ import annotations

import pytest
import torch
from row_helpers import labelled_rows

from twinkle_core.errors import InvalidInputError
from twinkle_core.optimizer.fused import prefer_fused
from twinkle_transformers import model as model_module
from twinkle_transformers.model import TransformersModel

pytestmark = pytest.mark.usefixtures('one_thread')


def train_losses(model: TransformersModel, steps: int = 2) -> list[float]:
    model.set_optimizer('AdamW', lr=1e-2, weight_decay=0.0)
    losses = []
    for step in range(steps):
        losses.append(model.forward_backward(inputs=labelled_rows(step))['loss'])
        model.clip_grad_and_step(max_norm=1.0)
    return losses


def test_compiled_layers_train_like_eager(tiny_model_dir):
    """aot_eager traces every decoder layer's forward and backward (no code generation): same numbers."""
    eager = train_losses(TransformersModel(tiny_model_dir))
    compiled = TransformersModel(tiny_model_dir, compile_layers='aot_eager')
    assert compiled.compile_backend == 'aot_eager'
    layers = compiled.model.get_decoder().layers
    assert all(layer._compiled_call_impl is not None for layer in layers)
    assert train_losses(compiled) == pytest.approx(eager, abs=1e-5)


@pytest.mark.slow
def test_inductor_compiled_layers_train_like_eager(tiny_model_dir):
    """compile_layers=True (inductor: generated C++ on CPU) over three steps, padding-free rows included."""
    eager = TransformersModel(tiny_model_dir)
    compiled = TransformersModel(tiny_model_dir, compile_layers=True)
    assert compiled.compile_backend == 'inductor'
    for model in (eager, compiled):
        model.set_processor('CausalLMProcessor', padding_free=True)
    assert train_losses(compiled, 3) == pytest.approx(train_losses(eager, 3), abs=1e-4)


def test_bad_compile_layers_value_is_refused(tiny_model_dir):
    with pytest.raises(InvalidInputError, match='compile_layers must be True, False or a torch.compile backend'):
        TransformersModel(tiny_model_dir, compile_layers=3)


@pytest.mark.parametrize('loss', ['CrossEntropyLoss', 'ChunkedCrossEntropyLoss'])
def test_mixed_precision_keeps_fp32_master_weights(tiny_model_dir, loss):
    """bf16 autocast forwards (full logits, or log-probs from hidden states whose backward recomputes under the
    same autocast) train fp32 weights; losses track the fp32 model's within bf16 rounding."""
    reference = TransformersModel(tiny_model_dir)
    mixed = TransformersModel(tiny_model_dir, mixed_precision='bf16')
    for model in (reference, mixed):
        model.set_loss(loss)
    assert mixed.dtype == torch.float32 and mixed.autocast_dtype == torch.bfloat16
    before = {n: p.detach().clone() for n, p in mixed.model.named_parameters()}
    got, want = train_losses(mixed), train_losses(reference)
    assert got == pytest.approx(want, rel=2e-2)
    assert got != pytest.approx(want, rel=1e-6)  # it did run in bf16
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    moved = [n for n, p in mixed.model.named_parameters() if not torch.equal(p, before[n])]
    assert len(moved) == len(before)
    state = next(iter(mixed.state.optimizer.state.values()))
    assert state['exp_avg'].dtype == torch.float32


def test_mixed_precision_needs_fp32_parameters(tiny_model_dir):
    with pytest.raises(InvalidInputError, match='keeps float32 master weights, but dtype is bfloat16'):
        TransformersModel(tiny_model_dir, dtype='bfloat16', mixed_precision='bf16')
    with pytest.raises(InvalidInputError, match="Unknown mixed_precision 'fp8'"):
        TransformersModel(tiny_model_dir, mixed_precision='fp8')


def test_logprobs_are_fetched_after_the_backward_is_queued(tiny_model_dir, monkeypatch):
    """forward_backward converts log-probs to Python lists (a host sync) only once gradients exist."""
    model = TransformersModel(tiny_model_dir)
    model.set_optimizer('AdamW', lr=1e-3)
    seen = []
    original = model_module.rows_logprobs

    def recording(batch, target_logps):
        seen.append(all(p.grad is not None for p in model.model.parameters()))
        return original(batch, target_logps)

    monkeypatch.setattr(model_module, 'rows_logprobs', recording)
    model.forward_backward(inputs=labelled_rows(0))
    model.forward_backward(inputs=labelled_rows(1) + labelled_rows(2), micro_batch_size=2)
    assert seen and all(seen)


def make_adamw(**kwargs) -> torch.optim.AdamW:
    torch.manual_seed(0)
    return torch.optim.AdamW([torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))], **kwargs)


def test_prefer_fused_switches_open_choices_only():
    """The fused kernels replace foreach only where the caller chose neither; the update is the same."""
    fused_here = make_adamw(lr=1e-2)
    assert prefer_fused(fused_here, devices=('cpu',))
    assert all(g['fused'] for g in fused_here.param_groups)
    reference = make_adamw(lr=1e-2)
    for opt in (fused_here, reference):
        for p in opt.param_groups[0]['params']:
            p.grad = torch.ones_like(p)
        opt.step()
    for a, b in zip(fused_here.param_groups[0]['params'], reference.param_groups[0]['params']):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert not prefer_fused(make_adamw(lr=1e-2, foreach=False), devices=('cpu',))  # the caller's choice stands
    assert not prefer_fused(fused_here, devices=('cpu',))  # already stepped: state exists
    assert not prefer_fused(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1.0), devices=('cpu',))
    assert not prefer_fused(make_adamw(lr=1e-2))  # the default: CUDA parameters only


def test_cpu_models_keep_torch_default_optimizer(tiny_model_dir):
    model = TransformersModel(tiny_model_dir)
    model.set_optimizer('AdamW', lr=1e-3)
    assert model.state.optimizer.param_groups[0]['fused'] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_fast_defaults_train_on_cuda(tiny_model_dir):
    """On CUDA: AdamW is fused by default; mixed precision with inductor-compiled layers trains like the eager
    bf16-autocast model (bf16 tolerance)."""
    eager = TransformersModel(tiny_model_dir, device='cuda', mixed_precision='bf16')
    fast = TransformersModel(tiny_model_dir, device='cuda', mixed_precision='bf16', compile_layers=True)
    want, got = train_losses(eager, 3), train_losses(fast, 3)
    assert fast.state.optimizer.param_groups[0]['fused'] is True
    assert got == pytest.approx(want, rel=2e-2)
