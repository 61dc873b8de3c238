"""What the routes check before a custom loss is stored (`create_custom_loss`) or used (`forward_backward` with
``loss_fn='custom'``): its tenant is not throttled (429), its graph is not disabled (422), and its estimated work
at a model's full context fits that model's budget (422 naming the costliest node; `custom_loss_cost`).

A new loss is refused when it fits no hosted model's budget (the request names no model); a use is refused when it
does not fit the budget of the model it would run on. Estimates are kept per (graph, model): each graph is priced
once per model.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from twinkle_server.api.tinker.datums import MAX_CANDIDATES
from twinkle_server.config import ServerConfig
from twinkle_server.engine.custom_loss.cost import CostLimits, Estimate
from twinkle_server.engine.custom_loss.guard import GUARD
from twinkle_server.engine.custom_loss.ops import GraphError
from twinkle_server.engine.custom_loss.program import CustomLossSpec
from twinkle_server.engine.model_host.base import ModelHost
from twinkle_server.errors import ApiError, unprocessable

_MAX_ESTIMATES = 4096
_estimates: OrderedDict[tuple[str, str, int], Estimate] = OrderedDict()
_lock = threading.Lock()


def limits(config: ServerConfig, host: ModelHost) -> CostLimits:
    """The custom-loss budget on `host`'s model (`custom_loss_cost_factor`, `custom_loss_max_gflop`,
    `custom_loss_time_s`)."""
    return CostLimits.for_model(
        host.model_dir,
        host.max_context_length,
        config.custom_loss_cost_factor,
        config.custom_loss_max_gflop,
        config.custom_loss_time_s,
    )


def check_tenant(tenant: str, spec: CustomLossSpec | None = None, loss_id: str | None = None) -> None:
    """422 when `spec` is disabled (it never runs again), else 429 while `tenant` is throttled for a loss that ran
    past its time budget."""
    why = GUARD.disabled(tenant, spec.digest) if spec is not None else None
    if why is not None:
        named = f'custom loss {spec.name!r}' + (f' ({loss_id})' if loss_id else '')  # type: ignore[union-attr]
        raise unprocessable(f'{named} is disabled: {why}')
    left = GUARD.penalty_left(tenant)
    if left > 0:
        raise ApiError(
            429,
            f'tenant {tenant!r} is throttled for custom losses for {left:.0f} s more: one of its custom losses ran '
            f'past its time budget (custom_loss_time_s)',
            retry_after_s=left,
        )


def _estimate(spec: CustomLossSpec, base_model: str, context: int) -> Estimate:
    key = (spec.digest, base_model, context)
    with _lock:
        found = _estimates.get(key)
    if found is None:
        found = spec.estimate(context, MAX_CANDIDATES)
        with _lock:
            _estimates[key] = found
            while len(_estimates) > _MAX_ESTIMATES:
                _estimates.popitem(last=False)
    return found


def check_cost(config: ServerConfig, hosts: dict[str, ModelHost], spec: CustomLossSpec) -> None:
    """`GraphError` unless `spec` fits the budget of at least one of `hosts` (naming its costliest node against
    the largest budget)."""
    errors: list[tuple[float, GraphError]] = []
    for name, host in hosts.items():
        budget = limits(config, host)
        try:
            _estimate(spec, name, budget.context).check(budget, name)
            return
        except GraphError as exc:
            errors.append((budget.flops, exc))
    if errors:
        raise max(errors, key=lambda e: e[0])[1]


def use_config(
    config: ServerConfig, host: ModelHost, tenant: str, loss_id: str, spec: CustomLossSpec
) -> dict[str, Any]:
    """The `loss_config` of a use of `spec` on `host` (with the tenant and the model's cost limits), after the
    checks of the module docstring (429 / 422)."""
    check_tenant(tenant, spec, loss_id)
    try:
        budget = limits(config, host)
        _estimate(spec, host.base_model, budget.context).check(budget, host.base_model)
    except GraphError as exc:
        raise unprocessable(f'custom loss {spec.name!r} ({loss_id}): {exc}') from None
    return spec.config(loss_id, tenant, budget)
