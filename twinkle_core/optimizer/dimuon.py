"""`Dimuon`: orthogonalised (Muon-family) updates for weight matrices, AdamW for every other parameter.

The optimizer behind Tinker's ``DimuonOptimizerConfig`` / ``DimuonParams`` (docs/tinker_api.md, "Optimizers"). For
each 2-D parameter ``W`` (every LoRA ``A`` and ``B``) with gradient ``G``::

    M <- beta1 * M + (1 - beta1) * G                       # EMA of the gradients (the only state)
    O <- NS(M)                                              # matrix sign (polar factor) by Newton-Schulz
    O <- O * sqrt(r) / ||O||_F,   r = min(rows, cols)       # a direction of Frobenius norm sqrt(rank)
    W <- W * (1 - lr * weight_decay) - lr * O

``NS`` is the quintic Newton-Schulz iteration of Muon (Keller Jordan's coefficients 3.4445, -4.7750, 2.0315, five
steps, on ``M / ||M||_F``), run in float32 whatever the parameter dtype. A matrix whose momentum is exactly zero
(LoRA ``A`` before ``B`` has moved) is left unchanged. Parameters of any other shape (biases, norms, DoRA
magnitudes) take an AdamW step with ``betas=(beta1, beta2)``, ``eps`` and the same ``lr`` / ``weight_decay``.

Why not `torch.optim.Muon`: it refuses non-2-D parameters (so a companion AdamW is needed anyway), keeps
SGD-style Nesterov momentum rather than an EMA, scales the step by the matrix's aspect ratio rather than to a fixed
Frobenius norm, and orthogonalises in bfloat16. One optimizer here keeps one ``state_dict`` (momenta, AdamW moments
and step counts) that `TrainState` saves and restores like AdamW's, so a resumed run continues bit for bit.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

#: Muon's quintic Newton-Schulz coefficients and step count (https://kellerjordan.github.io/posts/muon/)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


def matrix_sign(m: torch.Tensor, steps: int = NS_STEPS) -> torch.Tensor:
    """An approximate polar factor ``U V^T`` of ``m`` (``m = U S V^T``), float32, by Newton-Schulz."""
    a, b, c = NS_COEFFICIENTS
    x = m.to(torch.float32)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=NS_EPS)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class Dimuon(torch.optim.Optimizer):
    """Orthogonalised EMA-momentum steps for matrices, AdamW for the rest (module docstring).

    Hyper-parameters (every param group; `update_optimizer` sets them per step): ``lr``, ``beta1`` (momentum EMA,
    also AdamW's beta1), ``beta2`` and ``eps`` (AdamW only), ``weight_decay`` (decoupled, both paths).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        beta1: float = 0.9,
        beta2: float = 0.95,
        eps: float = 1e-12,
        weight_decay: float = 0.0,
    ) -> None:
        for name, value, ok in (
            ('lr', lr, lr >= 0),
            ('beta1', beta1, 0 <= beta1 < 1),
            ('beta2', beta2, 0 <= beta2 < 1),
            ('eps', eps, eps > 0),
            ('weight_decay', weight_decay, weight_decay >= 0),
        ):
            if not (math.isfinite(value) and ok):
                raise ValueError(f'Dimuon: invalid {name}={value!r}')
        defaults = {'lr': lr, 'beta1': beta1, 'beta2': beta2, 'eps': eps, 'weight_decay': weight_decay}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, beta1, wd = group['lr'], group['beta1'], group['weight_decay']
            for p in group['params']:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError('Dimuon does not support sparse gradients')
                if p.ndim == 2:
                    self._matrix_step(p, lr, beta1, wd)
                else:
                    self._adamw_step(p, lr, beta1, group['beta2'], group['eps'], wd)
        return loss

    def _matrix_step(self, p: torch.Tensor, lr: float, beta1: float, wd: float) -> None:
        state = self.state[p]
        if 'momentum' not in state:
            state['momentum'] = torch.zeros_like(p, memory_format=torch.preserve_format)
        m = state['momentum']
        m.mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
        if not bool(m.any()):
            return  # no direction yet (e.g. LoRA A while B is still zero)
        o = matrix_sign(m)
        o = o * (math.sqrt(min(p.shape)) / o.norm().clamp(min=NS_EPS))
        if wd:
            p.mul_(1.0 - lr * wd)
        p.add_(o.to(p.dtype), alpha=-lr)

    def _adamw_step(self, p: torch.Tensor, lr: float, beta1: float, beta2: float, eps: float, wd: float) -> None:
        state = self.state[p]
        if 'step' not in state:
            state['step'] = torch.zeros((), dtype=torch.float32)
            state['exp_avg'] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state['exp_avg_sq'] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state['step'] += 1
        step = float(state['step'])
        exp_avg, exp_avg_sq = state['exp_avg'], state['exp_avg_sq']
        exp_avg.mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
        if wd:
            p.mul_(1.0 - lr * wd)
        denom = (exp_avg_sq / (1.0 - beta2**step)).sqrt_().add_(eps)
        p.addcdiv_(exp_avg, denom, value=-lr / (1.0 - beta1**step))
