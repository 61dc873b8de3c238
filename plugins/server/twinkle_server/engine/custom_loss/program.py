"""Server-side custom losses (SDK 0.38 `ServiceClient.create_custom_loss`, `forward_backward(loss_fn='custom')`).

The SDK traces a per-datum loss ``fn(logprobs, *inputs) -> (loss, {"custom/<name>:sum|mean": tensor})`` with
`torch.fx` and uploads its nodes as plain data (`tinker.types.CustomLossGraph`). `CustomLossSpec.validate` checks
that graph node by node -- placeholders matching the declared inputs, every call on the whitelist of
`custom_loss_ops`, references only to earlier nodes, at most `MAX_NODES` nodes, a ``(loss, metrics)`` output --
and compiles it into a `Program`: a list of steps over whitelisted callables (nothing is ever `eval`'d,
imported or looked up by a client-given name). The loss runs the program once per datum, as the SDK does
client-side (`run_loss_handle`): the datum's ``logprobs`` (``[N]``, or ``[N, K]`` for 2-D ``target_tokens``) and
its declared inputs, on the CPU in float32; the request's loss is the sum of the datums' losses, metrics sum
(``:sum``) or average over datums (``:mean``). Rows carry the inputs as fields named by `input_field`
(`api/tinker/datums.py`). `GraphLoss` (`graph_loss.py`) is the program as a loss; losses are kept per session in
memory by the service (`service/custom_losses.py`).

Any malformed input or node is a `GraphError` naming it (never another exception: the route answers 422). Work is
bounded by `custom_loss_cost` (`CustomLossSpec.estimate` prices the graph at a model's full context for the route;
`Program.run` prices every node on its real operands before it runs, and checks the wall clock after it), and an
evaluation past its time budget disables the graph for its tenant (`custom_loss_guard`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from twinkle_server.engine.custom_loss import cost, ops
from twinkle_server.engine.custom_loss.ops import GraphError, Ref

MAX_NODES = 512
MAX_INPUTS = 16
MAX_ARG_ITEMS = 256  # encoded values in one node's arguments, nested ones included
MAX_ARG_DEPTH = 8
MAX_LOSSES_PER_TENANT = 256
_NODE_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]{0,127}')
_INPUT_NAME = re.compile(r'[a-z_][a-z0-9_]{0,63}')
_METRIC_KEY = re.compile(r'custom/[a-z0-9_./-]{1,64}:(sum|mean)')
_OPS = ('placeholder', 'call_function', 'call_method', 'output')


def input_field(name: str) -> str:
    """The row field carrying custom-loss input `name` (a matrix for rank 2, `twinkle_core.loss.candidates`)."""
    return f'custom:{name}'


@dataclass(frozen=True)
class Step:
    name: str
    op: str  # call_function | call_method
    target: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Program:
    """A validated graph: its inputs' names, the steps in order, the output's loss and metric references."""

    inputs: tuple[str, ...]
    steps: tuple[Step, ...]
    loss: Ref
    metrics: dict[str, Ref]

    def run(self, values: list[torch.Tensor], where: str, budget: cost.Budget) -> tuple[torch.Tensor, dict[str, Any]]:
        """(loss, metrics) of one datum; `GraphError` naming the node that fails, `cost.OverBudget` naming the node
        that would pass `budget`'s work (before it runs) or has passed its time (after it ran)."""
        env: dict[str, Any] = dict(zip(self.inputs, values))
        for step in self.steps:
            at = f'{where}: node {step.name!r} ({step.target})'
            args = [ops.resolve(a, env) for a in step.args]
            kwargs = {k: ops.resolve(v, env) for k, v in step.kwargs.items()}
            budget.charge(cost.node_cost(step.target, args, kwargs), at)
            env[step.name] = run_step(step, args, kwargs, at)
            budget.check_time(at)
        loss = env[self.loss.name]
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.dim() != 0:
            shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise GraphError(f'{where}: the loss must be a scalar tensor, got {shape}')
        metrics = {k: env[r.name] for k, r in self.metrics.items()}
        for key, value in metrics.items():
            if not isinstance(value, torch.Tensor) or value.numel() != 1:
                raise GraphError(f'{where}: metric {key!r} must be a scalar tensor')
        return loss, metrics


def run_step(step: Step, args: list[Any], kwargs: dict[str, Any], at: str, meta: bool = False) -> Any:
    """The value of one step on resolved operands, after `custom_loss_ops.check_call`; `GraphError` naming `at`.
    `meta`: operands are meta tensors (nothing is allocated: no element bound)."""
    bound = None if meta else ops.MAX_ELEMENTS
    if step.target in ops.GETATTR and step.op == 'call_function':
        return ops.read_attribute(args[0], args[1], at)
    ops.check_call(step.target, args, kwargs, at, bound)
    try:
        if step.op == 'call_method':
            if not args or not isinstance(args[0], torch.Tensor):
                got = type(args[0]).__name__ if args else 'nothing'
                raise GraphError(f'{at}: a method call needs a tensor, got {got}')
            value = getattr(args[0], step.target)(*args[1:], **kwargs)
        else:
            value = ops.FUNCTIONS[step.target](*args, **kwargs)
    except GraphError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the client's graph is the client's error
        raise GraphError(f'{at} failed: {type(exc).__name__}: {exc}') from None
    ops.check_result(value, at, bound)
    return value


@dataclass(frozen=True)
class LossInput:
    name: str
    rank: int  # 0 scalar, 1 [N], 2 [N, K]


@dataclass(frozen=True, eq=False)
class CustomLossSpec:
    """A validated custom loss: its name, inputs (``logprobs`` first), wire nodes, digest and compiled program."""

    name: str
    inputs: tuple[LossInput, ...]
    nodes: tuple[dict[str, Any], ...] = field(repr=False)
    digest: str
    program: Program = field(repr=False)

    @classmethod
    def validate(cls, name: str, inputs: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> CustomLossSpec:
        """Check a `CreateCustomLossRequest`'s name, inputs and graph nodes (JSON form); `GraphError` naming the
        first bad input or node."""
        if not isinstance(name, str) or not 0 < len(name) <= 128:
            raise GraphError('the loss name must be 1 to 128 characters')
        declared = _inputs(inputs)
        if not isinstance(nodes, list):
            raise GraphError(f'the graph nodes must be a list, got {type(nodes).__name__}')
        if len(nodes) > MAX_NODES:
            raise GraphError(f'the graph has {len(nodes)} nodes; at most {MAX_NODES} are allowed')
        return cls(name, declared, tuple(nodes), _digest(name, declared, nodes), _compile(declared, nodes))

    def config(self, loss_id: str, tenant: str, limits: cost.CostLimits) -> dict[str, Any]:
        """JSON-plain form for `TrainBatch.graph` (re-validated by `from_config` where the loss runs), with
        the tenant it runs for and the cost limits of the model it runs on."""
        return {
            'loss_id': loss_id,
            'name': self.name,
            'inputs': [{'name': i.name, 'rank': i.rank} for i in self.inputs],
            'nodes': list(self.nodes),
            'digest': self.digest,
            'tenant': tenant,
            'limits': limits.as_config(),
        }

    def estimate(self, context: int, width: int) -> cost.Estimate:
        """The FLOPs of one datum of `context` tokens (rank-2 inputs `width` wide), priced on meta tensors."""
        inputs = [(node, i.rank) for node, i in zip(self.program.inputs, self.inputs)]  # by placeholder node name
        return cost.estimate(
            self.program.steps, inputs, context, width, lambda st, a, k: run_step(st, a, k, '', meta=True)
        )

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CustomLossSpec:
        return cls.validate(config['name'], config['inputs'], config['nodes'])


def _inputs(inputs: list[dict[str, Any]]) -> tuple[LossInput, ...]:
    if not isinstance(inputs, list) or not 0 < len(inputs) <= MAX_INPUTS:
        got = len(inputs) if isinstance(inputs, list) else type(inputs).__name__
        raise GraphError(f'a custom loss takes a list of 1 to {MAX_INPUTS} inputs (logprobs first), got {got}')
    out = []
    for i, item in enumerate(inputs):
        name, rank = (item.get('name'), item.get('rank')) if isinstance(item, dict) else (None, None)
        if not isinstance(name, str) or not _INPUT_NAME.fullmatch(name) or _rank(rank) is None:
            raise GraphError(
                f'input {i} ({str(name)[:70]!r}, rank {str(rank)[:20]}): needs a lowercase name and rank 0, 1 or 2'
            )
        out.append(LossInput(name, int(rank)))  # type: ignore[arg-type]
    if out[0].name != 'logprobs' or out[0].rank not in (1, 2):
        raise GraphError('the first input must be logprobs, of rank 1 ([N]) or 2 ([N, K])')
    if len({i.name for i in out}) != len(out):
        raise GraphError(f'input names repeat: {[i.name for i in out]}')
    return tuple(out)


def _rank(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1, 2) else None


def _compile(inputs: tuple[LossInput, ...], nodes: list[dict[str, Any]]) -> Program:
    defined: set[str] = set()
    placeholders: list[str] = []
    steps: list[Step] = []
    output: tuple[Ref, dict[str, Ref]] | None = None
    for index, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise GraphError(f'node {index}: must be an object with op, name and target, got {type(node).__name__}')
        name = node.get('name')
        where = f'node {index} ({str(name)[:130]!r})'
        try:
            output = _node(node, inputs, defined, placeholders, steps, output, where)
        except GraphError:
            raise
        except Exception as exc:  # noqa: BLE001 - a malformed node is the client's error, never a 500
            raise GraphError(f'{where}: malformed node ({type(exc).__name__}: {str(exc)[:200]})') from None
    if len(placeholders) != len(inputs):
        raise GraphError(f'the graph has {len(placeholders)} placeholders for {len(inputs)} declared inputs')
    if output is None:
        raise GraphError('the graph has no output node')
    return Program(tuple(placeholders), tuple(steps), *output)


def _node(
    node: dict[str, Any],
    inputs: tuple[LossInput, ...],
    defined: set[str],
    placeholders: list[str],
    steps: list[Step],
    output: tuple[Ref, dict[str, Ref]] | None,
    where: str,
) -> tuple[Ref, dict[str, Ref]] | None:
    """Check one node and add it to `defined` and `placeholders` or `steps`; the output once it is seen."""
    op, name, target = node.get('op'), node.get('name'), node.get('target')
    if output is not None:
        raise GraphError(f'{where}: comes after the output node')
    if op not in _OPS:
        raise GraphError(f'{where}: op {str(op)[:60]!r} is not allowed (allowed: {", ".join(_OPS)})')
    if not isinstance(name, str) or not _NODE_NAME.fullmatch(name) or name in defined:
        raise GraphError(f'{where}: node names must be unique identifiers')
    if not isinstance(target, str):
        raise GraphError(f'{where}: target must be a string, got {type(target).__name__}')
    decode = ops.Decoder(defined, where, MAX_ARG_ITEMS, MAX_ARG_DEPTH)
    args, kwargs = node.get('args') or [], node.get('kwargs') or {}
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise GraphError(f'{where}: args must be a list and kwargs an object')
    if op == 'placeholder':
        if steps or len(placeholders) >= len(inputs) or target != inputs[len(placeholders)].name:
            expected = [i.name for i in inputs]
            raise GraphError(f'{where}: placeholders must come first and be the inputs {expected} in order')
        placeholders.append(name)
    elif op == 'output':
        output = _output(decode(args), where)
    else:
        _check_target(op, target, args, where)
        steps.append(Step(name, op, target, tuple(decode(args)), {str(k): decode(v) for k, v in kwargs.items()}))
    defined.add(name)
    return output


def _check_target(op: str, target: str, args: list[Any], where: str) -> None:
    if op == 'call_method':
        if target not in ops.METHODS:
            raise GraphError(f'{where}: tensor method {target!r} is not on the allowed list')
        if not args:
            raise GraphError(f'{where}: a method call needs the tensor it is called on')
    elif target in ops.GETATTR:
        if len(args) != 2 or not isinstance(args[1], str) or args[1] not in ops.ATTRIBUTES:
            got = str(args[1])[:60] if len(args) == 2 else f'{len(args)} arguments'
            raise GraphError(
                f'{where}: getattr takes (tensor, attribute name) and may read only {sorted(ops.ATTRIBUTES)}; got {got}'
            )
    elif target not in ops.FUNCTIONS:
        raise GraphError(f'{where}: function {target!r} is not on the allowed list of torch, operator and math ops')


def _output(args: list[Any], where: str) -> tuple[Ref, dict[str, Ref]]:
    value = args[0] if len(args) == 1 else None
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], Ref)):
        raise GraphError(f'{where}: the output must be (loss, metrics) with the loss a tensor node')
    metrics = value[1]
    if not isinstance(metrics, dict):
        raise GraphError(f'{where}: the metrics must be a dict')
    for key, ref in metrics.items():
        if not _METRIC_KEY.fullmatch(key) or not isinstance(ref, Ref):
            raise GraphError(f'{where}: metric {key!r} must be named custom/<name>:sum or :mean and be a tensor')
    return value[0], dict(metrics)


def _digest(name: str, inputs: tuple[LossInput, ...], nodes: list[dict[str, Any]]) -> str:
    body = json.dumps([name, [[i.name, i.rank] for i in inputs], nodes], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()
