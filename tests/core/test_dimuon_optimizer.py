"""`Dimuon` (Tinker's `dimuon`): orthogonalised EMA-momentum steps of Frobenius norm lr*sqrt(rank) for matrices,
AdamW for every other parameter, one resumable state_dict."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from twinkle_core.optimizer.dimuon import Dimuon, matrix_sign
from twinkle_core.registry import resolve


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(8, 32, generator=g)),  # LoRA A: r x in
        torch.nn.Parameter(torch.randn(48, 8, generator=g)),  # LoRA B: out x r
        torch.nn.Parameter(torch.randn(16, generator=g)),  # not a matrix: AdamW
    ]


def _grads(params: list[torch.nn.Parameter], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def test_matrix_step_is_an_orthogonal_direction_of_norm_lr_sqrt_rank():
    params = _params()
    before = [p.detach().clone() for p in params]
    opt = Dimuon(params, lr=0.01, beta1=0.9)
    _grads(params, 1)
    opt.step()
    for p, w0 in zip(params[:2], before[:2]):
        delta = (w0 - p.detach()) / 0.01
        assert float(delta.norm()) == pytest.approx(math.sqrt(min(p.shape)), rel=1e-5)
        # Newton-Schulz leaves the singular values near 1 (Muon's quintic: within about [0.6, 1.3])
        s = torch.linalg.svdvals(delta) / (math.sqrt(min(p.shape)) / float(delta.norm()))
        assert float(s.min()) > 0.5 and float(s.max()) < 1.4, s
        # first step: the momentum is (1 - beta1) * G, and the direction its polar factor, rescaled
        expected = matrix_sign(0.1 * p.grad)
        expected = expected * (math.sqrt(min(p.shape)) / expected.norm())
        torch.testing.assert_close(delta, expected, rtol=1e-4, atol=1e-5)


def test_non_matrix_parameters_take_exactly_an_adamw_step():
    p = torch.nn.Parameter(torch.randn(16))
    q = torch.nn.Parameter(p.detach().clone())
    ours = Dimuon([p], lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-8, weight_decay=0.1)
    ref = torch.optim.AdamW([q], lr=1e-2, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(3):
        g = torch.randn(16, generator=torch.Generator().manual_seed(step))
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)


def test_zero_momentum_leaves_a_matrix_unchanged():
    """LoRA A gets a zero gradient while B is still zero: no direction, no update (and no NaN)."""
    p = torch.nn.Parameter(torch.randn(4, 16))
    w0 = p.detach().clone()
    opt = Dimuon([p], lr=0.1)
    p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.equal(p.detach(), w0)


def test_state_dict_resume_continues_bit_for_bit():
    a = _params(3)
    opt_a = Dimuon(a, lr=0.02, beta1=0.9)
    for step in range(2):
        _grads(a, 10 + step)
        opt_a.step()
    saved = copy.deepcopy(opt_a.state_dict())  # as a checkpoint holds it (state_dict() shares the tensors)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_b = Dimuon(b, lr=0.02, beta1=0.9)
    opt_b.load_state_dict(saved)
    for step in range(2):
        _grads(a, 20 + step)
        _grads(b, 20 + step)
        opt_a.step()
        opt_b.step()
    for p, q in zip(a, b):
        assert torch.equal(p.detach(), q.detach())


def test_hyper_parameters_are_per_step_and_checked():
    opt = resolve('optimizer', 'Dimuon', params=_params(), lr=1e-3)
    assert isinstance(opt, Dimuon) and set(opt.defaults) >= {'lr', 'beta1', 'beta2', 'eps', 'weight_decay'}
    with pytest.raises(ValueError, match='beta1'):
        Dimuon(_params(), beta1=1.0)
    with pytest.raises(ValueError, match='lr'):
        Dimuon(_params(), lr=float('nan'))
