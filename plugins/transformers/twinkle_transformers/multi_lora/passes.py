"""Which passes a multi-tenant step runs, and what happens when one fails.

`run_tenants` is the whole multi-tenant step:

1. tenants are grouped by input processor (one collated layout per pass; by default everybody shares one), and
   the `PassPlanner` splits each group into passes (one mixed pass, groups of tenants, or one by one) by measured
   cost; each pass is timed and fed back to it. A tenant whose own call exceeds the planner's cap
   (`max_pass_tokens`) runs alone, in pieces, with the result of one pass (`tenant_split`);
2. each pass is a `MixedPass` (collate, one forward with per-token LoRA routing, each tenant's loss, one backward);
3. if a shared pass itself raises (collation, forward, backward), the group is retried without the tenants whose
   rows do not collate, then tenant by tenant, so the failure is pinned on the tenant that causes it.

`forward_passes` is the first half of the same step for `forward` -> `calculate_loss` -> `backward` (every pass
kept for its backward, so a call is not split there: splitting would not bound its memory).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from twinkle_core.model.step_errors import TenantStepError
from twinkle_transformers.multi_lora.manager import MultiLoraManager
from twinkle_transformers.multi_lora.mixed_pass import MixedPass, TenantWork, as_tenant_error
from twinkle_transformers.multi_lora.pass_planner import PassPlanner, TenantSize, pass_cost_tokens
from twinkle_transformers.multi_lora.tenant_split import run_pieces, split_rows


def run_tenants(
    model: torch.nn.Module,
    manager: MultiLoraManager,
    work: list[TenantWork],
    *,
    train: bool,
    planner: PassPlanner,
    device: torch.device | None = None,
) -> None:
    """Run every tenant's micro-batch (forward + backward when `train`); fills each `TenantWork.result` or
    `.error`. Never raises for a tenant's fault. `planner` decides which tenants share a pass and learns from the
    timing of each; a tenant whose call alone exceeds its cap runs in pieces (`tenant_split`)."""

    def run_pass(members: list[TenantWork], cost_tokens: int) -> None:
        start = time.perf_counter()
        clean = _run_isolating(model, manager, members, train=train, device=device)
        if clean:  # a pass retried after a failure would teach the planner a wrong cost
            planner.record(cost_tokens, time.perf_counter() - start, tenants=len(members), train=train)

    for group in group_by_processor(work):
        packed = is_packed(group)
        shared = []
        for w in group:
            pieces = split_rows(w, planner.max_pass_tokens, packed=packed)
            if pieces is None:
                shared.append(w)
            else:
                planner.stats['split_calls'] += 1
                run_pieces(manager, w, pieces, run_pass, packed=packed, train=train)
        for members, cost in planned_passes(planner, shared, train=train) if shared else ():
            run_pass(members, cost)


def is_packed(group: list[TenantWork]) -> bool:
    """Whether the group's processor packs rows (padding-free) rather than padding them."""
    return bool(getattr(group[0].state.processor, 'padding_free', False))


def planned_passes(planner: PassPlanner, group: list[TenantWork], *, train: bool) -> list[tuple[list[TenantWork], int]]:
    """The passes `planner` chooses for one processor group, each with its cost tokens."""
    packed = is_packed(group)
    sizes = [TenantSize.of([len(row['input_ids']) for row in w.rows]) for w in group]
    plan = planner.plan(sizes, packed=packed, train=train)
    return [
        ([group[i] for i in members], pass_cost_tokens([sizes[i] for i in members], packed=packed))
        for members in plan.groups
    ]


def _run_isolating(
    model: torch.nn.Module,
    manager: MultiLoraManager,
    group: list[TenantWork],
    *,
    train: bool,
    device: torch.device | None,
) -> bool:
    """Run `group` in one pass; if the shared pass itself fails, pin the failure on the tenants causing it:
    first tenants whose rows do not collate (the rest retry together), then, if the pass still fails, each
    tenant alone. Returns whether the first pass went through (no retry)."""
    try:
        MixedPass(model, manager, group, train=train, device=device).run()
        return True
    except Exception as exc:
        if len(group) == 1:
            group[0].result, group[0].error = None, as_tenant_error(group[0].name, exc)
            return False
    collatable = []
    for w in group:
        try:
            w.state.processor(w.rows)
            collatable.append(w)
        except Exception as exc:
            w.result, w.error = None, TenantStepError(w.name, 'input', f'{type(exc).__name__}: {exc}')
    if 1 < len(collatable) < len(group):
        try:
            MixedPass(model, manager, collatable, train=train, device=device).run()
            return False
        except Exception:
            pass
    for w in collatable:
        _run_isolating(model, manager, [w], train=train, device=device)
    return False


def group_by_processor(work: list[TenantWork]) -> list[list[TenantWork]]:
    """Tenants whose processors collate alike (same registry name and arguments, or the same instance)."""
    groups: dict[Any, list[TenantWork]] = {}
    for w in work:
        spec = w.state.specs.get('processor', {})
        name = spec.get('name', '')
        key = (name, repr(sorted(spec.get('kwargs', {}).items()))) if ':' not in name else id(w.state.processor)
        groups.setdefault(key, []).append(w)
    return list(groups.values())


def forward_passes(
    model: torch.nn.Module,
    manager: MultiLoraManager,
    work: list[TenantWork],
    planner: PassPlanner,
    device: torch.device,
    errors: dict[str, TenantStepError],
) -> list[MixedPass]:
    """`work`'s forwards with gradients, in the passes the planner sizes, kept for their losses and backward
    (`MultiLoraTransformersModel.forward`); a pass that fails records its tenants' errors in `errors`."""
    passes = []
    for by_processor in group_by_processor(work):
        for group, _ in planned_passes(planner, by_processor, train=True):
            mixed_pass = MixedPass(model, manager, group, train=True, device=device)
            try:
                mixed_pass.forward()
                passes.append(mixed_pass)
            except Exception as exc:
                errors.update({w.name: as_tenant_error(w.name, exc) for w in group})
    return passes


# ---- a sharded base: every rank runs the same passes (`data_parallel`) ------------------------------------------
DUMMY_ROW = {'input_ids': [0, 0], 'labels': [-100, -100]}  # a rank's stand-in where it has no rows in a pass


def lockstep_passes(
    model: torch.nn.Module,
    manager: MultiLoraManager,
    members: list[TenantWork],
    *,
    train: bool,
    device: torch.device | None,
) -> list[MixedPass]:
    """The passes of a call over a sharded base, the same on every rank: one per processor group of `members` (every
    rank's tenants, in name order; those without rows here have none), whatever rows each rank holds. A tenant whose
    rows do not collate here is rejected here (and by `DataRanks.finish` everywhere); a pass with no rows here runs
    a dummy row through its first tenant's adapter that trains nothing, so that every rank runs every pass's
    collectives. No planner: a pass per processor group, without the `max_pass_tokens` cap."""
    passes = []
    for group in group_by_processor(sorted(members, key=lambda w: w.name)):
        local = []
        for w in group:
            if not w.rows:
                continue
            try:
                w.state.processor(w.rows)
                local.append(w)
            except Exception as exc:
                w.result, w.error = None, TenantStepError(w.name, 'input', f'{type(exc).__name__}: {exc}')
        if not local:
            stand_in = TenantWork(group[0].name, group[0].state, [dict(DUMMY_ROW)], compute_loss=False)
            local = [stand_in]
        passes.append(MixedPass(model, manager, local, train=train, device=device, lockstep=True))
    return passes


def run_lockstep(passes: list[MixedPass]) -> None:
    """Run `lockstep_passes`; a pass that raises rejects its tenants on this rank (no retry: a retry would run
    collectives the other ranks do not)."""
    for mixed_pass in passes:
        try:
            mixed_pass.run()
        except Exception as exc:
            for w in mixed_pass.group:
                w.result, w.error = None, as_tenant_error(w.name, exc)
