"""What a custom loss may cost: a price per whitelisted op, a static estimate of a graph at the model's full context,
and the per-evaluation budget (work and wall clock) every evaluation is checked against.

Work is counted in floating-point operations (FLOPs), priced from the operands' shapes (`node_cost`): elementwise
ops and reductions by their elements; sorts, `topk` and `argsort` by ``n log n``; products by ``m n k``; matrix
decompositions (the nuclear norm's SVD, and eig / qr / det / inv / solve / lstsq / matrix_rank / pinv should they
ever be allowed) by ``min(m, n)^2 max(m, n)`` per matrix, times `DECOMPOSITION_FACTOR`; every node also pays
`NODE_OVERHEAD` for its Python dispatch. `estimate` runs a program on meta tensors (shapes only, nothing computed)
of the model's full context length and prices every node; `CostLimits` is the budget of one model: at most
``cost_factor x 2 x parameters x context`` FLOPs (its forward pass over a full context, `forward_flops`) and at most
``max_gflop`` GFLOPs per full context of tokens, and `time_s` seconds of wall clock per evaluation. The route
refuses a graph whose estimate passes the budget (422 naming its costliest node); `Budget` enforces the same prices
on the real operands before each node runs, and the clock after each node (a graph whose shapes hide its cost from
the meta run is still stopped before its costly node runs).
"""

from __future__ import annotations

import functools
import json
import math
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from twinkle_server.engine.custom_loss import ops
from twinkle_server.engine.custom_loss.ops import GraphError

#: FLOP-equivalents of one node's Python dispatch (about 10 us at 1 GFLOP/s), so many tiny nodes are priced too
NODE_OVERHEAD = 10_000
#: constant of the O(min^2 max) matrix decompositions (an SVD is several passes of Householder reflections)
DECOMPOSITION_FACTOR = 8
#: FLOPs per element of ops that do more than one operation per element (softmax, logsumexp, std, ...)
MULTI_PASS = 4


class OverBudget(GraphError):
    """An evaluation that passed its work or time budget; `over_time` when it was the wall clock."""

    def __init__(self, message: str, over_time: bool) -> None:
        super().__init__(message)
        self.over_time = over_time


# ---- prices per op -------------------------------------------------------------------------------------------------
_VIEWS = frozenset(
    'reshape view flatten squeeze unsqueeze transpose permute t detach size dim numel getattr builtins.getattr '
    'torch.squeeze torch.unsqueeze torch.reshape torch.flatten torch.transpose torch.detach'.split()
)
_SORTS = frozenset({'sort', 'argsort', 'topk'})
_MULTI = frozenset({'softmax', 'log_softmax', 'logsumexp', 'std', 'var', 'softplus', 'logsigmoid', 'silu', 'norm'})
_PRODUCTS = frozenset({'matmul', 'mm', 'bmm', 'einsum', 'outer', 'inner', 'dot', 'tensordot', 'kron'})
#: O(min(m, n)^2 max(m, n)) per matrix; the nuclear norm (``norm(x, 'nuc')``) is an SVD
DECOMPOSITIONS = frozenset(
    'svd svdvals eig eigh eigvals eigvalsh qr det slogdet logdet inv inv_ex solve solve_ex lstsq matrix_rank pinv '
    'cholesky lu lu_factor matrix_norm matrix_power matrix_exp'.split()
)


def _short(target: str) -> str:
    """``torch.functional.norm`` -> ``norm``; ``operator.mul`` -> ``mul``."""
    return target.rsplit('.', 1)[-1]


def _tensors(args: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in args:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += _tensors(v)
        elif isinstance(v, dict):
            out += _tensors(v.values())
    return out


def _broadcast_numel(tensors: list[torch.Tensor]) -> int:
    try:
        return math.prod(torch.broadcast_shapes(*(t.shape for t in tensors)))
    except RuntimeError:
        return max((t.numel() for t in tensors), default=0)


def _matrix_cost(x: torch.Tensor) -> int:
    """min(m, n)^2 max(m, n) for each matrix of `x`'s last two dimensions (a vector is one row)."""
    shape = tuple(x.shape) if x.dim() >= 2 else (1, max(1, x.numel()))
    m, n = shape[-2], shape[-1]
    return math.prod(shape[:-2]) * min(m, n) ** 2 * max(m, n)


def _is_matrix_norm(target: str, args: list[Any], kwargs: dict[str, Any]) -> bool:
    """``norm(x, 'nuc')``: an SVD (a numeric `p` is a vector norm, priced by its elements)."""
    p = kwargs.get('p', args[1] if len(args) > 1 else None)
    return _short(target) in ('norm', 'matrix_norm') and p == 'nuc'


def _product_cost(args: list[Any]) -> int:
    mats = [t for t in args if isinstance(t, torch.Tensor)][:2]
    if len(mats) < 2:
        return sum(t.numel() for t in mats)
    a, b = mats
    k = a.shape[-1] if a.dim() else 1
    return max(1, a.numel() // max(1, k)) * k * max(1, b.numel() // max(1, k))


def node_cost(target: str, args: list[Any], kwargs: dict[str, Any]) -> int:
    """FLOPs of calling `target` (a wire function name or a tensor method name) on these operands, priced from
    their shapes before the call runs (module docstring); always at least `NODE_OVERHEAD`."""
    tensors = _tensors((*args, *kwargs.values()))
    name = _short(target)
    sizes = [t.numel() for t in tensors]
    if target in _VIEWS or name in _VIEWS or not tensors:
        work = 0
    elif _is_matrix_norm(target, args, kwargs) or name in DECOMPOSITIONS:
        work = DECOMPOSITION_FACTOR * _matrix_cost(tensors[0])
    elif name in _PRODUCTS:
        work = _product_cost(args)
    elif name in _SORTS:
        dim = kwargs.get('dim', -1)
        x = tensors[0]
        length = x.shape[dim] if x.dim() and isinstance(dim, int) and -x.dim() <= dim < x.dim() else x.numel()
        work = x.numel() * max(1, math.ceil(math.log2(max(2, length))))
    elif name in ('stack', 'cat'):
        work = sum(sizes)
    elif name == 'getitem':
        base = args[0] if args and isinstance(args[0], torch.Tensor) else None
        index = sum(sizes[1:]) if base is not None else 0
        rows = base.numel() // max(1, base.shape[0]) if base is not None and base.dim() else 1
        work = max(sizes[0], index * rows)
    elif name in _MULTI:
        work = MULTI_PASS * max(sum(sizes), _broadcast_numel(tensors))
    else:  # elementwise, reductions, cumulative ops, comparisons, conversions, *_like: one pass over the elements
        work = max(sum(sizes), _broadcast_numel(tensors))
    return NODE_OVERHEAD + int(work)


# ---- the budget of one model ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostLimits:
    """The budget of custom losses on one base model (JSON-plain in `TrainBatch.graph['limits']`): `flops`
    per full `context` of tokens, and `time_s` of wall clock per evaluation."""

    flops: float
    context: int
    time_s: float

    @classmethod
    def for_model(
        cls, model_dir: str, context: int, cost_factor: float, max_gflop: float | None, time_s: float
    ) -> CostLimits:
        """``min(cost_factor x forward_flops, max_gflop x 1e9)`` per full context (None: no absolute cap)."""
        flops = cost_factor * forward_flops(model_dir, context)
        if max_gflop is not None:
            flops = min(flops, max_gflop * 1e9)
        return cls(float(flops), int(context), float(time_s))

    def as_config(self) -> dict[str, Any]:
        return {'flops': self.flops, 'context': self.context, 'time_s': self.time_s}

    @classmethod
    def from_config(cls, value: Any) -> CostLimits:
        if not isinstance(value, dict):
            raise GraphError('the custom loss arrived without its cost limits (TrainBatch.graph limits)')
        return cls(float(value['flops']), int(value['context']), float(value['time_s']))

    def budget(self, tokens: int) -> Budget:
        """The budget of one evaluation over `tokens` tokens: `flops` per started full context."""
        contexts = max(1, math.ceil(tokens / max(1, self.context)))
        return Budget(self.flops * contexts, self.time_s)


def forward_flops(model_dir: str, context: int) -> float:
    """FLOPs of the model's forward pass over `context` tokens: 2 x parameters x context."""
    return 2.0 * parameter_count(model_dir) * context


@functools.lru_cache(maxsize=64)
def parameter_count(model_dir: str) -> int:
    """Parameters of the model in `model_dir`, from its safetensors headers (no weights are read); else from its
    weight files' size at 2 bytes a parameter (an over-estimate only for float32 weights)."""
    root = Path(model_dir)
    total = 0
    for path in sorted(root.glob('*.safetensors')):
        with path.open('rb') as f:
            (length,) = struct.unpack('<Q', f.read(8))
            header = json.loads(f.read(length))
        total += sum(math.prod(v['shape']) for k, v in header.items() if k != '__metadata__')
    if total:
        return total
    weights = [p for pattern in ('*.bin', '*.pt', '*.pth') for p in root.glob(pattern)]
    total = sum(p.stat().st_size for p in weights) // 2
    if not total:
        raise GraphError(f'cannot size the model in {model_dir} to budget custom losses (no weight files found)')
    return total


class Budget:
    """One evaluation's allowance: `flops` of priced work (`charge`, before each node runs) and `time_s` of wall
    clock from its creation (`check_time`, after each node). Both raise `OverBudget` naming the node."""

    def __init__(self, flops: float, time_s: float | None = None) -> None:
        self.flops, self.used, self.time_s = flops, 0, time_s
        self.started = time.monotonic()

    def charge(self, flops: int, where: str) -> None:
        self.used += flops
        if self.used > self.flops:
            raise OverBudget(
                f'{where}: the loss would need about {_g(self.used)} FLOPs, more than its budget of '
                f'{_g(self.flops)} (custom_loss_cost_factor / custom_loss_max_gflop); simplify it or send fewer tokens',
                over_time=False,
            )

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def check_time(self, where: str) -> None:
        if self.time_s is not None and self.elapsed() > self.time_s:
            raise OverBudget(
                f'{where}: the evaluation ran {self.elapsed():.2f} s, past its time budget of {self.time_s:g} s '
                f'(custom_loss_time_s)',
                over_time=True,
            )


def _g(flops: float) -> str:
    return f'{flops / 1e9:.3g} G'


# ---- the static estimate --------------------------------------------------------------------------------------------
class _Unknown:
    """The value of a node the meta run could not compute (data-dependent shape, or a shape error at full length)."""


UNKNOWN = _Unknown()


@dataclass(frozen=True)
class Estimate:
    """FLOPs of one datum of the full context: in all, per node, and the nodes the meta run could not price."""

    total: int
    per_node: dict[str, int]
    unpriced: tuple[str, ...]

    def costliest(self) -> tuple[str, int]:
        return max(self.per_node.items(), key=lambda kv: kv[1], default=('', 0))

    def check(self, limits: CostLimits, model: str) -> None:
        """`GraphError` naming the costliest node when the estimate passes `limits.flops`."""
        if self.total > limits.flops:
            node, cost = self.costliest()
            raise GraphError(
                f'node {node!r} is estimated at {_g(cost)} FLOPs (the graph at {_g(self.total)}) for one datum of '
                f'{limits.context} tokens, over the custom-loss budget of {_g(limits.flops)} FLOPs on {model!r} '
                f'(custom_loss_cost_factor x the forward pass, at most custom_loss_max_gflop)'
            )


def estimate(steps: Any, inputs: list[tuple[str, int]], context: int, width: int, call: Callable[..., Any]) -> Estimate:
    """Price `steps` (a `Program`'s) for one datum of `context` tokens: `inputs` as (placeholder node, rank) become meta
    tensors ``[]``, ``[context]`` or ``[context, width]``; `call(step, args, kwargs)` runs one step (on meta
    tensors). A node whose value cannot be computed on meta tensors, and everything depending on it, is left
    unpriced (the run-time `Budget` prices it on the real operands)."""
    shapes = {0: (), 1: (context,), 2: (context, width)}
    env: dict[str, Any] = {name: torch.empty(shapes[rank], device='meta') for name, rank in inputs}
    per_node: dict[str, int] = {}
    unpriced: list[str] = []
    for step in steps:
        args = [ops.resolve(a, env) for a in step.args]
        kwargs = {k: ops.resolve(v, env) for k, v in step.kwargs.items()}
        if _has_unknown((*args, *kwargs.values())):
            env[step.name] = UNKNOWN
            unpriced.append(step.name)
            continue
        per_node[step.name] = node_cost(step.target, args, kwargs)
        try:
            env[step.name] = call(step, args, kwargs)
        except Exception:  # noqa: BLE001 - data-dependent or length-dependent: priced at run time instead
            env[step.name] = UNKNOWN
    return Estimate(sum(per_node.values()), per_node, tuple(unpriced))


def _has_unknown(values: Any) -> bool:
    for v in values:
        if v is UNKNOWN:
            return True
        if isinstance(v, (list, tuple)) and _has_unknown(v):
            return True
        if isinstance(v, dict) and _has_unknown(v.values()):
            return True
        if isinstance(v, slice) and _has_unknown((v.start, v.stop, v.step)):
            return True
    return False
