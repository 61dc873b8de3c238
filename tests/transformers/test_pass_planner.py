"""The multi-tenant pass planner: partitions, the cost model, and the choice it converges to on known cost curves.

The planner's input is measured pass times; here they come from explicit cost curves, so what the planner
should choose is computable and checked exactly (the timing-driven engine path is covered in
test_multi_lora_planning.py)."""

from __future__ import annotations

import math

import pytest

from twinkle_transformers.multi_lora.pass_planner import (
    PassCostModel,
    PassPlanner,
    TenantSize,
    partition,
    pass_cost_tokens,
)


def _sizes(*shapes: tuple[int, int]) -> list[TenantSize]:
    return [TenantSize.of([tokens] * rows) for rows, tokens in shapes]


def test_cost_tokens_count_padding_unless_packed():
    sizes = [TenantSize.of([10, 30]), TenantSize.of([50])]
    assert pass_cost_tokens(sizes, packed=True) == 90
    assert pass_cost_tokens(sizes, packed=False) == 3 * 50  # three rows padded to the longest


def test_partition_groups_similar_lengths_under_the_budget():
    sizes = _sizes((1, 100), (1, 10), (1, 100), (1, 10))
    assert partition(sizes, None, packed=False) == ((0, 1, 2, 3),)
    assert partition(sizes, 0, packed=False) == ((0,), (1,), (2,), (3,))
    # shortest first: the two 10-token tenants share a pass, the 100-token ones another (no padding 10 -> 100)
    assert partition(sizes, 200, packed=False) == ((1, 3), (0, 2))
    # a tenant larger than the budget still runs, alone
    assert partition(_sizes((4, 64), (1, 8)), 32, packed=False) == ((1,), (0,))


def test_cost_model_needs_samples_and_ignores_one_outlier():
    costs = PassCostModel(window=5, min_samples=2)
    costs.record(512, 0.5, tenants=2, train=True)
    assert costs.per_token(512, tenants=2, train=True) is None
    costs.record(500, 0.5, tenants=3, train=True)  # same class: 257..512 tokens, several tenants, training
    costs.record(512, 50.0, tenants=2, train=True)  # a pause while measuring
    assert costs.per_token(400, tenants=4, train=True) == pytest.approx(0.5 / 500)
    assert costs.per_token(512, tenants=1, train=True) is None  # single-tenant passes are another class
    assert costs.per_token(512, tenants=2, train=False) is None  # forward-only passes too
    with pytest.raises(ValueError, match='min_samples'):
        PassCostModel(window=2, min_samples=3)


def _pass_seconds(tokens: int, tenants: int, *, fixed: float, per_token: float, knee: int) -> float:
    """A CPU-like pass: a fixed cost, a per-token cost that grows with every doubling past `knee` tokens
    (activations fall out of the caches), and a small per-tenant cost (loss, slicing)."""
    slope = per_token * (1 + max(0.0, math.log2(tokens / knee)))
    return fixed + tokens * slope + 1e-4 * tenants


def _drive(planner: PassPlanner, sizes: list[TenantSize], steps: int, **curve: float) -> list[float]:
    """Run `steps` planned steps against the cost curve; returns each step's seconds."""
    seconds = []
    for _ in range(steps):
        plan = planner.plan(sizes, packed=False, train=True)
        total = 0.0
        for group in plan.groups:
            tokens = pass_cost_tokens([sizes[i] for i in group], packed=False)
            t = _pass_seconds(tokens, len(group), **curve)
            planner.record(tokens, t, tenants=len(group), train=True)
            total += t
        seconds.append(total)
    return seconds


def _best_plan_seconds(sizes: list[TenantSize], **curve: float) -> tuple[float, float]:
    """(fastest seconds over every candidate plan, seconds of one-by-one)."""
    planner = PassPlanner()
    plans = planner._candidates(sizes, packed=False)
    cost = [
        sum(_pass_seconds(pass_cost_tokens([sizes[i] for i in g], packed=False), len(g), **curve) for g in p.groups)
        for p in plans
    ]
    return min(cost), cost[0]


CURVES = {
    # tiny batches: the fixed cost of a pass dominates -> one mixed pass
    'overhead_bound': (_sizes(*[(1, 16)] * 16), dict(fixed=0.05, per_token=1e-5, knee=4096), 'mixed'),
    # large batches past the knee -> one tenant per pass
    'memory_bound': (_sizes(*[(8, 256)] * 4), dict(fixed=0.001, per_token=1e-4, knee=1024), 'one_by_one'),
    # in between -> groups that stay under the knee
    'knee_in_between': (_sizes(*[(4, 64)] * 16), dict(fixed=0.02, per_token=1e-4, knee=1024), 'groups'),
}


@pytest.mark.parametrize('case', CURVES)
def test_auto_converges_to_the_fastest_plan_and_never_loses_to_one_by_one(case):
    sizes, curve, expected = CURVES[case]
    planner = PassPlanner(revisit_every=0)  # revisits: the next test
    seconds = _drive(planner, sizes, 20, **curve)
    best, one_by_one = _best_plan_seconds(sizes, **curve)
    assert planner.last_plan.strategy == expected and not planner.last_plan.exploring
    assert seconds[-1] == pytest.approx(best)
    assert seconds[-1] <= one_by_one
    assert planner.stats['exploring'] <= 8  # stops growing passes once they stop paying
    assert planner.stats['mixed'] + planner.stats['groups'] + planner.stats['one_by_one'] == 20
    if expected == 'groups':
        assert max(pass_cost_tokens([sizes[i] for i in g], packed=False) for g in planner.last_plan.groups) <= 1024


def test_a_plan_measured_under_load_is_revisited_and_chosen_once_the_load_is_gone():
    sizes, curve, expected = CURVES['overhead_bound']
    planner = PassPlanner(revisit_every=4)
    loaded = True

    def step() -> None:
        plan = planner.plan(sizes, packed=False, train=True)
        for group in plan.groups:
            tokens = pass_cost_tokens([sizes[i] for i in group], packed=False)
            slow = 10.0 if loaded and plan.strategy == 'mixed' else 1.0  # another process hogs the core
            planner.record(tokens, slow * _pass_seconds(tokens, len(group), **curve), tenants=len(group), train=True)

    for _ in range(8):
        step()
    assert planner.last_plan.strategy != 'mixed'  # misled: one mixed pass measured 10x too slow
    loaded = False
    for _ in range(40):
        step()
    assert planner.last_plan.strategy == expected == 'mixed'


def test_exploration_starts_one_by_one_and_stops_at_the_first_size_that_does_not_pay():
    sizes, curve, _ = CURVES['memory_bound']
    planner = PassPlanner()
    first = planner.plan(sizes, packed=False, train=True)
    assert first.strategy == 'one_by_one' and first.exploring
    planner.record(2048, 99.0, tenants=1, train=True)  # the cold first step is not measured
    assert planner.costs.per_token(2048, tenants=1, train=True) is None and not planner.costs._samples
    _drive(planner, sizes, 10, **curve)
    budgets = [k for k in planner.costs._samples if k[1]]  # multi-tenant size classes ever measured
    assert len(budgets) == 1  # tried pairs (4096 tokens) once: slower per token, so never 8192 tokens


def test_cap_bounds_every_pass_and_fixed_strategies():
    sizes = _sizes(*[(4, 64)] * 8)  # 256 tokens each, 2048 in all
    mixed = PassPlanner('mixed', max_pass_tokens=1024).plan(sizes, packed=False, train=True)
    assert mixed.strategy == 'groups' and [len(g) for g in mixed.groups] == [4, 4]
    assert PassPlanner('mixed', max_pass_tokens=None).plan(sizes, packed=False, train=True).strategy == 'mixed'
    assert PassPlanner('one_by_one').plan(sizes, packed=False, train=True).groups == tuple((i,) for i in range(8))
    planner = PassPlanner(max_pass_tokens=512)
    _drive(planner, sizes, 12, fixed=1.0, per_token=1e-6, knee=10**6)  # bigger is always better
    assert all(pass_cost_tokens([sizes[i] for i in g], packed=False) <= 512 for g in planner.last_plan.groups)
    with pytest.raises(ValueError, match="unknown pass strategy 'fastest'; choose one of auto, mixed, one_by_one"):
        PassPlanner('fastest')
    with pytest.raises(ValueError, match='max_pass_tokens'):
        PassPlanner(max_pass_tokens=0)


@pytest.mark.parametrize('gain, expected', [(0.01, 'one_by_one'), (0.10, 'mixed')])
def test_larger_passes_must_win_by_more_than_the_tie_margin(gain, expected):
    sizes = _sizes((1, 64), (1, 64))  # one by one: 2 passes of 64 tokens; mixed: one pass of 128
    planner = PassPlanner(revisit_every=0)
    for _ in range(2):
        planner.record(64, 64 * 1e-3, tenants=1, train=True)
        planner.record(128, 128 * 1e-3 * (1 - gain), tenants=2, train=True)
    assert planner.plan(sizes, packed=False, train=True).strategy == expected
