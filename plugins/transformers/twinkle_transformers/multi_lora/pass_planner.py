"""Which tenants share a forward/backward pass: the cost-based planner of a multi-tenant step.

One mixed pass over every tenant saves the fixed cost of a pass (kernel launches, Python, per-layer glue) N - 1
times, but a pass that is too large is slower per token (activations fall out of the caches, padding grows to the
longest row, large allocations page-fault; on a GPU, small passes leave the device idle instead). So the step is
split into passes of at most B tokens, and B is chosen from measured cost:

- candidate plans: tenants sorted by row length, packed greedily into passes of at most B cost tokens, for B = 0
  (one tenant per pass: what training the adapters one by one does) and every power of two up to the whole step
  (one mixed pass), never above `max_pass_tokens` (the memory cap; a tenant larger than the cap runs alone);
- the cost of a pass is predicted from the recent seconds per token of passes of the same size class (power-of-two
  bucket of its cost tokens; single-tenant and multi-tenant passes apart, training and forward-only apart);
- a plan is *known* when all its passes' size classes have been measured `min_samples` times. The planner runs the
  cheapest known plan -- or a plan of smaller passes predicted within `tie` (3%) of it: smaller passes hold less
  memory, and a few percent is within the noise of timing on a shared machine. While the plan it picks is the
  largest one measured so far (cost per token still falling as passes grow), it tries the next larger plan instead.
  It starts with one tenant per pass, so it never explores below the one-by-one baseline and stops growing passes
  at the first size that does not pay;
- the passes of the first step are not measured: the first step of a process is slow everywhere (the allocator
  grows, pages are touched the first time), and a baseline measured then would make every larger plan look better;
- every `revisit_every`-th choice re-measures a neighbour of the best plan (next smaller or larger, in turn), so a
  size class measured during a burst of load from other processes is corrected instead of avoided for good.

Cost tokens of a pass: rows x longest row for a padded batch, the sum of row lengths for a packed one.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Sequence

STRATEGIES = ('auto', 'mixed', 'one_by_one')
DEFAULT_MAX_PASS_TOKENS = 16384


@dataclass(frozen=True)
class TenantSize:
    """The shape of one tenant's micro-batch: number of rows, longest row, total tokens."""

    rows: int
    longest: int
    tokens: int

    @classmethod
    def of(cls, lengths: Sequence[int]) -> TenantSize:
        return cls(len(lengths), max(lengths, default=0), sum(lengths))


@dataclass(frozen=True)
class PassPlan:
    """`groups`: indices of the tenants of each pass, in running order; `strategy`: 'mixed' (one pass),
    'one_by_one' or 'groups'; `budget`: cost tokens per pass the plan was built for (None: unbounded);
    `exploring`: the plan was chosen to measure a pass size not measured yet."""

    groups: tuple[tuple[int, ...], ...]
    strategy: str
    budget: int | None
    exploring: bool = False


def pass_cost_tokens(sizes: Sequence[TenantSize], *, packed: bool) -> int:
    """Tokens a pass over `sizes` computes: the sum for a packed batch, rows x longest row for a padded one."""
    if packed:
        return sum(s.tokens for s in sizes)
    return sum(s.rows for s in sizes) * max((s.longest for s in sizes), default=0)


def partition(sizes: Sequence[TenantSize], budget: int | None, *, packed: bool) -> tuple[tuple[int, ...], ...]:
    """Tenants (indices into `sizes`) packed into passes of at most `budget` cost tokens (None: one pass).

    Tenants are taken shortest rows first, so a padded pass holds rows of similar length; a tenant whose own batch
    is larger than the budget gets a pass of its own. Budget 0 gives one tenant per pass in the given order."""
    if budget is None:
        return (tuple(range(len(sizes))),)
    if budget <= 0:
        return tuple((i,) for i in range(len(sizes)))
    order = sorted(range(len(sizes)), key=lambda i: sizes[i].longest)
    groups: list[list[int]] = []
    for i in order:
        if groups and pass_cost_tokens([sizes[j] for j in groups[-1]] + [sizes[i]], packed=packed) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return tuple(tuple(g) for g in groups)


class PassCostModel:
    """Recent seconds per cost token of passes, per size class: (training?, several tenants?, power-of-two bucket)."""

    def __init__(self, window: int = 5, min_samples: int = 2) -> None:
        if window < 1 or not 1 <= min_samples <= window:
            raise ValueError(f'need window >= 1 and 1 <= min_samples <= window, got {window=}, {min_samples=}')
        self.window, self.min_samples = window, min_samples
        self._samples: dict[tuple[bool, bool, int], deque[float]] = {}

    @staticmethod
    def key(tokens: int, *, tenants: int, train: bool) -> tuple[bool, bool, int]:
        return train, tenants > 1, max(0, math.ceil(math.log2(max(tokens, 1))))

    def record(self, tokens: int, seconds: float, *, tenants: int, train: bool) -> None:
        """Add one measured pass (`tokens` cost tokens over `tenants` tenants took `seconds`)."""
        if tokens <= 0 or not math.isfinite(seconds) or seconds < 0:
            return
        key = self.key(tokens, tenants=tenants, train=train)
        self._samples.setdefault(key, deque(maxlen=self.window)).append(seconds / tokens)

    def per_token(self, tokens: int, *, tenants: int, train: bool) -> float | None:
        """Median recent seconds per token of passes of this size class; None until measured `min_samples` times."""
        samples = self._samples.get(self.key(tokens, tenants=tenants, train=train))
        if samples is None or len(samples) < self.min_samples:
            return None
        return statistics.median(samples)


class PassPlanner:
    """Chooses the passes of each multi-tenant step (see the module docstring).

    `strategy`: 'auto' (measured, the default), 'mixed' (one pass per step, up to `max_pass_tokens`) or
    'one_by_one'. `max_pass_tokens`: cost tokens a pass may hold (None: no cap) -- it bounds the activation memory
    of a step to what the largest of (the cap, the largest single tenant) needs. `revisit_every`: re-measure a
    neighbour of the best plan every so many choices (0: never). `tie`: relative cost difference within which the
    plan with smaller passes is preferred.
    """

    def __init__(
        self,
        strategy: str = 'auto',
        *,
        max_pass_tokens: int | None = DEFAULT_MAX_PASS_TOKENS,
        revisit_every: int = 16,
        tie: float = 0.03,
        cost_model: PassCostModel | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f'unknown pass strategy {strategy!r}; choose one of {", ".join(STRATEGIES)}.')
        if max_pass_tokens is not None and max_pass_tokens < 1:
            raise ValueError(f'max_pass_tokens must be a positive number of tokens or None, got {max_pass_tokens}.')
        if revisit_every < 0:
            raise ValueError(f'revisit_every must be >= 0 (0: never), got {revisit_every}.')
        self.strategy, self.max_pass_tokens = strategy, max_pass_tokens
        self.revisit_every, self.tie = revisit_every, tie
        self.costs = cost_model or PassCostModel()
        self.last_plan: PassPlan | None = None
        self._choices = 0  # plans chosen by cost (strategy 'auto'), for the periodic revisit
        self._plans_made = 0  # the passes of plan 1 (the cold first step) are not measured
        #: plans chosen per strategy, passes run, plans that explored a new pass size, and calls of one tenant
        #: above `max_pass_tokens` run in pieces (`tenant_split`)
        self.stats = {'mixed': 0, 'groups': 0, 'one_by_one': 0, 'passes': 0, 'exploring': 0, 'split_calls': 0}

    def plan(self, sizes: Sequence[TenantSize], *, packed: bool, train: bool) -> PassPlan:
        """The passes for tenants of `sizes` (one processor group of one step)."""
        if self.strategy == 'one_by_one' or len(sizes) <= 1:
            chosen = self._plan(sizes, 0, packed=packed)
        elif self.strategy == 'mixed':
            chosen = self._plan(sizes, self.max_pass_tokens, packed=packed)
        else:
            chosen = self._choose(self._candidates(sizes, packed=packed), sizes, packed=packed, train=train)
        self.last_plan = chosen
        self._plans_made += 1
        self.stats[chosen.strategy] += 1
        self.stats['passes'] += len(chosen.groups)
        self.stats['exploring'] += chosen.exploring
        return chosen

    def record(self, tokens: int, seconds: float, *, tenants: int, train: bool) -> None:
        """Feed back one pass's measured time (see `PassCostModel.record`); ignored during the first plan."""
        if self._plans_made != 1:
            self.costs.record(tokens, seconds, tenants=tenants, train=train)

    # ---- internals -----------------------------------------------------------------------------------------
    def _plan(
        self, sizes: Sequence[TenantSize], budget: int | None, *, packed: bool, exploring: bool = False
    ) -> PassPlan:
        groups = partition(sizes, budget, packed=packed)
        if len(groups) == 1 and len(sizes) > 1:
            strategy = 'mixed'
        elif all(len(g) == 1 for g in groups):
            strategy = 'one_by_one'
        else:
            strategy = 'groups'
        return PassPlan(groups, strategy, budget, exploring)

    def _candidates(self, sizes: Sequence[TenantSize], *, packed: bool) -> list[PassPlan]:
        """Distinct plans by growing budget: one by one, then powers of two up to one pass (or the cap)."""
        total = pass_cost_tokens(sizes, packed=packed)
        cap = self.max_pass_tokens
        budgets: list[int | None] = [0]
        smallest = min(pass_cost_tokens([s], packed=packed) for s in sizes)
        budget = 1 << max(0, math.ceil(math.log2(max(smallest, 1))))
        while budget < total and (cap is None or budget <= cap):
            budgets.append(budget)
            budget *= 2
        if cap is None or total <= cap:
            budgets.append(None)
        elif budgets[-1] != cap:
            budgets.append(cap)
        plans: list[PassPlan] = []
        for b in budgets:
            candidate = self._plan(sizes, b, packed=packed)
            if not plans or candidate.groups != plans[-1].groups:
                plans.append(candidate)
        return plans

    def _predict(self, plan: PassPlan, sizes: Sequence[TenantSize], *, packed: bool, train: bool) -> float | None:
        total = 0.0
        for group in plan.groups:
            tokens = pass_cost_tokens([sizes[i] for i in group], packed=packed)
            per_token = self.costs.per_token(tokens, tenants=len(group), train=train)
            if per_token is None:
                return None
            total += tokens * per_token
        return total

    def _choose(self, plans: list[PassPlan], sizes: Sequence[TenantSize], *, packed: bool, train: bool) -> PassPlan:
        predicted = [self._predict(p, sizes, packed=packed, train=train) for p in plans]
        known = [(i, cost) for i, cost in enumerate(predicted) if cost is not None]
        if not known:  # start from the baseline: one tenant per pass
            return _exploring(plans[0])
        cheapest = min(cost for _, cost in known)
        best = next(i for i, cost in known if cost <= cheapest * (1 + self.tie))
        if best == known[-1][0] and best + 1 < len(plans):  # still cheaper per token as passes grow: try larger
            return _exploring(plans[best + 1])
        self._choices += 1
        neighbours = [i for i in (best - 1, best + 1) if 0 <= i < len(plans)]
        if self.revisit_every and neighbours and self._choices % self.revisit_every == 0:
            return _exploring(plans[neighbours[(self._choices // self.revisit_every) % len(neighbours)]])
        return plans[best]


def _exploring(plan: PassPlan) -> PassPlan:
    return PassPlan(plan.groups, plan.strategy, plan.budget, exploring=True)
