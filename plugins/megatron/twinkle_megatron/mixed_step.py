"""Several adapters' rows in ONE pipeline schedule of `MegatronModel` (``inputs={adapter: rows}``): `run_mixed`.

Each micro-batch holds one tenant's rows, collated by that tenant's processor and split as a call of that adapter
alone splits them (`step.collate`), and activates that tenant's adapter before its forward. The schedule runs
every tenant's micro-batches back to back: tenants fill the pipeline together (fewer bubbles under pp) and a
call costs one schedule instead of one per tenant. Each micro-batch's loss is its tenant's loss times its
tenant's scale (accumulation, data-parallel weight, share), and its gradients land in that tenant's own Megatron
DDP buffers (adapters share no trainable parameter): each adapter's gradients, loss and metrics are those of a
call of that adapter alone.

Isolation: a tenant whose rows fail validation or collation is rejected before the schedule; a tenant whose loss
or fresh gradients are not finite is rejected after it, its gradients put back to what they were before the
call. The ranks agree: a tenant rejected on any rank (data rank or pipeline stage) is rejected on all of them,
and no other tenant is affected. A failure of the schedule itself restores every tenant's gradients and raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from twinkle_core.model.step_errors import TenantStepError
from twinkle_core.runtime.distributed import all_reduce_sum, is_initialized
from twinkle_megatron import adapter_scope, groups, schedule, step
from twinkle_megatron.units import TrainingUnit

NOT_FINITE_LOSS = (
    'the loss is not finite (NaN/inf); check this batch (e.g. NaN/inf in advantages, weights or reference '
    'logprobs). Nothing was applied.'
)
NOT_FINITE_GRADIENTS = (
    'the gradients of this call are not finite (NaN/inf); they were discarded and the adapter is unchanged.'
)


@dataclass
class Tenant:
    """One adapter's part of a mixed call on this rank (no rows here: `batches` empty)."""

    name: str
    unit: TrainingUnit
    batches: list[dict[str, Any]] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)
    weight: float = 0.0  # this rank's loss weight (`step.collate`)
    micro: list[schedule.MicroBatch] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    earlier: list[torch.Tensor] = field(default_factory=list)  # its gradient buffers before the call


def run_mixed(
    model: Any,
    inputs: dict[str, Any],
    *,
    training: bool,
    compute_loss: bool,
    micro_batch_size: int | None,
) -> tuple[list[str], dict[str, dict[str, Any]], dict[str, TenantStepError]]:
    """Run every adapter's rows of `inputs` (this rank's) in one schedule; returns (the call's adapters, in the
    order every rank uses; the accepted ones' results; the rejected ones' errors)."""
    tenants: dict[str, Tenant] = {}
    errors: dict[str, TenantStepError] = {}
    for name, rows in inputs.items():
        tenant = tenants[name] = Tenant(name, model.unit_for(name))
        if not rows:  # none of its rows on this data rank: it joins the call with none
            continue
        try:
            tenant.batches, tenant.shares, tenant.weight = step.collate(model, tenant.unit, rows, micro_batch_size)
        except Exception as exc:  # noqa: BLE001 - only this tenant is rejected
            errors[name] = TenantStepError(name, 'input', f'{type(exc).__name__}: {exc}')
    names, errors = _agree(list(inputs), errors)
    live = [tenants.get(n) or Tenant(n, model.unit_for(n)) for n in names if n not in errors]
    totals = all_reduce_sum([t.weight for t in live], groups.dp_group())
    for t, total in zip(live, totals):
        scale = t.unit.state.loss_scale() * step.dp_share(t.unit, t.weight, total)
        t.micro = [schedule.MicroBatch(b, s, t.unit.state.loss, scale, t.name) for b, s in zip(t.batches, t.shares)]
        t.unit.wrap()
    _run_schedule(model, live, training=training, compute_loss=compute_loss)
    rejected = {t.name: e for t in live if (e := _outcome_error(t, training=training)) is not None}
    errors.update(_agree(names, rejected)[1])
    with_loss = all_reduce_sum([float(any('loss' in i for i in t.infos)) for t in live], groups.dp_group())
    results: dict[str, dict[str, Any]] = {}
    for t, ranks_with_loss in zip(live, with_loss):
        if training:
            _put_back(t, keep_new=t.name not in errors)
        if t.name in errors:
            continue
        reduce = compute_loss and ranks_with_loss > 0
        result, summary = step.tenant_result(model, t.unit, t.micro, t.infos, t.weight, reduce=reduce)
        if summary is not None:
            t.unit.state.record(summary, is_training=training)
            if training:
                t.unit.last_loss = summary['loss']
        results[t.name] = result
    return names, results, errors


def _run_schedule(model: Any, live: list[Tenant], *, training: bool, compute_loss: bool) -> None:
    """All live tenants' micro-batches through one schedule (their earlier gradients set aside when `training`);
    each tenant's infos land in `Tenant.infos`."""
    micro = [m for t in live for m in t.micro]
    if not micro:  # no rows on this data rank (its pipeline peers have none either)
        return
    if training:
        for t in live:
            t.earlier = [g.clone() for g in _grad_buffers(t.unit)]
            for g in _grad_buffers(t.unit):
                g.zero_()
    try:
        with adapter_scope.trainable(model.chunks, [t.name for t in live]), torch.set_grad_enabled(training):
            infos = step.run_schedule(
                model,
                live[0].unit.chunks,
                micro,
                training=training,
                compute_loss=compute_loss,
                activate=lambda name: adapter_scope.activate(model.chunks, name),
            )
    except BaseException:
        if training:
            for t in live:
                _put_back(t, keep_new=False)
        raise
    start = 0
    for t in live:
        t.infos, start = infos[start : start + len(t.micro)], start + len(t.micro)


def _agree(names: list[str], errors: dict[str, TenantStepError]) -> tuple[list[str], dict[str, TenantStepError]]:
    """Every rank's adapters (in one order) and errors: an adapter rejected on one rank is rejected on all, with
    the first such rank's reason."""
    if not is_initialized() or dist.get_world_size() == 1:
        return names, errors
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (names, {n: (e.stage, e.detail) for n, e in errors.items()}))
    agreed = list(dict.fromkeys(n for rank_names, _ in gathered for n in rank_names))
    everywhere: dict[str, TenantStepError] = {}
    for rank, (_, rank_errors) in enumerate(gathered):
        for name, (stage, detail) in rank_errors.items():
            if name not in everywhere:
                everywhere[name] = TenantStepError(
                    name, stage, f'{detail} (seen on rank {rank}; nothing was applied on any rank)'
                )
    return agreed, everywhere


def _outcome_error(t: Tenant, *, training: bool) -> TenantStepError | None:
    """Why `t`'s part of the schedule on this rank is rejected: its loss raised or is not finite, or (`training`)
    its fresh gradients are not finite; None when it is accepted here."""
    for info in t.infos:
        if 'loss_error' in info:
            exc = info['loss_error']
            return TenantStepError(t.name, 'loss', f'{type(exc).__name__}: {exc}')
    if any('loss' in info and not math.isfinite(info['loss']) for info in t.infos):
        return TenantStepError(t.name, 'loss', NOT_FINITE_LOSS)
    if training and not all(bool(torch.isfinite(g).all()) for g in _grad_buffers(t.unit)):
        return TenantStepError(t.name, 'gradient', NOT_FINITE_GRADIENTS)
    return None


def _grad_buffers(unit: TrainingUnit) -> list[torch.Tensor]:
    """The unit's Megatron DDP gradient buffers on this rank (its parameters' ``main_grad`` are views of them)."""
    return [b.grad_data for chunk in unit.chunks for b in (*chunk.buffers, *chunk.expert_parallel_buffers)]


def _put_back(t: Tenant, *, keep_new: bool) -> None:
    """Give `t`'s buffers their gradients from before the call again, plus the call's when `keep_new`."""
    for g, old in zip(_grad_buffers(t.unit), t.earlier):
        if keep_new:
            g.add_(old)
        else:
            g.copy_(old)
    t.earlier = []
