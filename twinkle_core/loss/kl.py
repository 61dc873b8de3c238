"""Per-token estimators of KL(policy || reference) from tokens sampled by the policy (Schulman, "Approximating KL
Divergence", 2020), with ``log_ratio = logp - ref_logp``:

- ``'k1'``: ``log_ratio`` -- unbiased, high variance, can be negative (TRL's and OpenRLHF's default in the reward);
- ``'k2'``: ``0.5 * log_ratio ** 2`` -- biased, low variance, >= 0;
- ``'k3'``: ``exp(-log_ratio) - 1 + log_ratio`` -- unbiased, low variance, >= 0 (GRPO's penalty in the loss).

In the loss: ``GRPOLoss(beta=..., kl_estimator=...)``. In the reward: ``GAEAdvantage`` / ``ReinforcePlusPlusAdvantage``
take per-token ``kl=`` values, e.g. ``kl_estimate(logps, ref_logps, 'k1')`` of each completion.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle_core.errors import InvalidInputError

KL_ESTIMATORS = ('k1', 'k2', 'k3')


def check_estimator(who: str, estimator: str) -> None:
    if estimator not in KL_ESTIMATORS:
        raise InvalidInputError(f'{who}: unknown kl_estimator {estimator!r}; choose one of {", ".join(KL_ESTIMATORS)}.')


def kl_estimate(logps: Any, ref_logps: Any, estimator: str = 'k3') -> torch.Tensor:
    """The per-token estimate (same shape as `logps`; tensors or sequences of floats) of KL(policy || reference)."""
    check_estimator('kl_estimate', estimator)
    lp, ref = torch.as_tensor(logps), torch.as_tensor(ref_logps)
    log_ratio = lp - ref.to(lp.dtype)
    if estimator == 'k1':
        return log_ratio
    if estimator == 'k2':
        return 0.5 * log_ratio**2
    return torch.exp(-log_ratio) - 1.0 + log_ratio
