"""A multi-tenant call of the Transformers engine: what it returns to its caller (`step_outcome`) and a `forward`
waiting for its `calculate_loss` / `backward`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinkle_core.model.mixed_calls import call_outcome
from twinkle_core.model.step_errors import TenantStepError
from twinkle_transformers.multi_lora.mixed_pass import MixedPass, TenantWork


@dataclass
class PendingStep:
    """A `forward` waiting for `calculate_loss` / `backward`."""

    work: list[TenantWork]
    errors: dict[str, TenantStepError]
    mixed: bool
    passes: list[MixedPass]
    rank_call: Any = None  # the `data_parallel.RankCall` of a model on several data ranks


def step_outcome(
    work: list[TenantWork], errors: dict[str, TenantStepError], mixed: bool, *, return_errors: bool
) -> dict[str, Any]:
    """The caller's result of the tenants' `work` (`twinkle_core.model.mixed_calls.call_outcome`)."""
    errors = {**errors, **{w.name: w.error for w in work if w.error is not None}}
    results = {
        w.name: {k: v for k, v in w.result.items() if not k.startswith('_')}
        for w in work
        if w.error is None and w.result is not None
    }
    names = list(dict.fromkeys([*(w.name for w in work), *errors]))
    return call_outcome(names, results, errors, mixed, return_errors=return_errors)
