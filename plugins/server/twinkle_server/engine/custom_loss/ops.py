"""What a server-side custom loss may do: the whitelist of functions, tensor methods and attributes, the decoding of
encoded constant arguments, and the size bounds every call is checked against before it runs (its work is priced
by `custom_loss_cost`).

A function is named on the wire as the SDK names it (`torch.fx`'s qualified name, ``_operator.`` spelt
``operator.``); the table below is built from the allowed callables themselves, so the names always agree and
nothing else can ever be looked up. Nothing here writes in place, allocates from a size argument (``zeros``,
``expand``, ``repeat``, ``matmul``...), leaves torch or touches a device other than the CPU.
"""

from __future__ import annotations

import builtins
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.fx.node import _get_qualified_name

#: elements of any one intermediate tensor (16 MiB of float32)
MAX_ELEMENTS = 1 << 22


class GraphError(ValueError):
    """A custom loss graph that is refused (when validated) or fails (when evaluated); the message names the node."""


_UNARY = (
    'exp log log1p expm1 log2 log10 sqrt rsqrt abs neg sign sigmoid tanh relu square reciprocal isfinite isnan isinf '
    'logical_not nan_to_num'
).split()
_BINARY = 'add sub mul div true_divide pow minimum maximum eq ne lt le gt ge logical_and logical_or logical_xor'.split()
_OTHER = 'where clamp clip masked_fill gather softmax log_softmax'.split()
_REDUCE = (
    'sum mean amax amin max min logsumexp prod std var norm cumsum any all count_nonzero argmax argmin sort argsort '
    'topk'
).split()
_LIKE = 'zeros_like ones_like full_like'.split()
_COMBINE = ('stack', 'cat')
_SHAPE_METHODS = (
    'reshape view flatten squeeze unsqueeze transpose permute t contiguous detach clone float double bool long int '
    'to type_as size dim numel'
).split()

_TORCH_FUNCTIONS = [getattr(torch, n) for n in (*_UNARY, *_BINARY, *_OTHER, *_REDUCE, *_LIKE, *_COMBINE)]
_TORCH_FUNCTIONS += [F.log_softmax, F.softmax, F.relu, F.softplus, F.logsigmoid, F.silu]
_TORCH_FUNCTIONS += [torch.squeeze, torch.unsqueeze, torch.reshape, torch.flatten, torch.transpose, torch.detach]
_OPERATORS = 'add sub mul truediv floordiv mod pow neg pos abs eq ne lt le gt ge and_ or_ xor invert getitem'.split()
_MATH = (math.sqrt, math.log, math.exp, math.log1p, math.expm1, math.fabs)


def wire_name(fn: Callable[..., Any]) -> str:
    """The name the SDK sends for `fn` (`tinker.lib.public_interfaces.custom_loss.encode_graph`)."""
    name = _get_qualified_name(fn)
    return 'operator.' + name.removeprefix('_operator.') if name.startswith('_operator.') else name


#: wire name -> the function it runs
FUNCTIONS: dict[str, Callable[..., Any]] = {
    wire_name(f): f for f in (*_TORCH_FUNCTIONS, *(getattr(operator, n) for n in _OPERATORS), *_MATH)
}
GETATTR = frozenset({'getattr', 'builtins.getattr'})
#: what `getattr` may read from a tensor
ATTRIBUTES = frozenset({'shape', 'ndim', 'T', 'mT', 'dtype', 'device'})
#: tensor methods a `call_method` node may call
METHODS = frozenset(
    n for n in (*_UNARY, *_BINARY, *_OTHER, *_REDUCE, *_SHAPE_METHODS) if hasattr(torch.Tensor, n)
) | frozenset({'div', 'mul', 'add', 'sub'})
#: python operators that only make sense on numbers and tensors (on a string or a list they would allocate freely)
_ARITHMETIC = frozenset(wire_name(getattr(operator, n)) for n in _OPERATORS if n != 'getitem')
_POW = frozenset({wire_name(operator.pow), 'torch.pow'})
_COMBINING = frozenset(wire_name(getattr(torch, n)) for n in _COMBINE)
_GETITEM = wire_name(operator.getitem)

DTYPES = {
    name: getattr(torch, name) for name in ('float16', 'bfloat16', 'float32', 'float64', 'int32', 'int64', 'bool')
}
_CONSTANTS: dict[str, dict[str, Any]] = {
    'dtype': DTYPES,
    'device': {'cpu': torch.device('cpu')},
    'layout': {'strided': torch.strided},
    'memory_format': {'contiguous_format': torch.contiguous_format, 'preserve_format': torch.preserve_format},
    'float': {'inf': math.inf, '-inf': -math.inf, 'nan': math.nan},
}
#: keyword arguments that would write into a tensor the graph does not own
FORBIDDEN_KWARGS = frozenset({'out', 'inplace'})
#: the only strings a call may pass (a device name other than the CPU's, e.g. ``.to('cuda')``, must not get through)
_STRINGS = frozenset({'cpu', 'fro', 'nuc'})


def decode_constant(kind: str, value: Any) -> Any:
    """An encoded one-key constant (``{"dtype": "float32"}``, ``{"float": "inf"}``, ...); GraphError otherwise."""
    table = _CONSTANTS.get(kind)
    if table is None or not isinstance(value, str) or value not in table:
        allowed = {k: sorted(v) for k, v in _CONSTANTS.items()}
        raise GraphError(f'constant {{{kind!r}: {value!r}}} is not allowed (allowed: {allowed})')
    return table[value]


def _tensors(values: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += [x for x in v if isinstance(x, torch.Tensor)]
    return out


def check_call(
    target: str, args: list[Any], kwargs: dict[str, Any], where: str, max_elements: int | None = MAX_ELEMENTS
) -> None:
    """Refuse a call before it runs when its output could pass `max_elements` (None: unchecked, for meta tensors),
    it would write in place, or a Python operator gets operands other than numbers and tensors (its work is priced
    by `custom_loss_cost.node_cost`)."""
    bad = sorted(k for k in FORBIDDEN_KWARGS if kwargs.get(k))
    if bad:
        raise GraphError(f'{where}: keyword {bad[0]!r} is not allowed (it writes into an existing tensor)')
    values = (*args, *kwargs.values())
    if target in _ARITHMETIC:
        for v in values:
            if not isinstance(v, (torch.Tensor, int, float, bool)):
                raise GraphError(f'{where}: operands must be tensors or numbers, got {type(v).__name__}')
    for v in values:
        if (isinstance(v, str) and v not in _STRINGS) or (isinstance(v, torch.device) and v.type != 'cpu'):
            raise GraphError(f'{where}: argument {v!r} is not allowed (custom losses run on the CPU)')
    if target in _POW and len(args) == 2 and isinstance(args[1], int) and not isinstance(args[0], torch.Tensor):
        if abs(args[1]) > 64:
            raise GraphError(f'{where}: an integer power above 64 is not allowed')
    operands = _tensors((*args, *kwargs.values()))
    sizes = [t.numel() for t in operands]
    if target in _COMBINING:
        estimate = sum(sizes)
    elif target == _GETITEM and operands and isinstance(args[0], torch.Tensor) and args[0].dim():
        index = sum(sizes[1:])  # advanced indexing: up to one row of args[0] per index element
        estimate = max(sizes[0], index * (sizes[0] // max(1, args[0].shape[0])))
    else:
        try:
            estimate = math.prod(torch.broadcast_shapes(*(t.shape for t in operands))) if operands else 0
        except RuntimeError:
            estimate = max(sizes, default=0)
    if max_elements is not None and estimate > max_elements:
        raise GraphError(f'{where}: would make a tensor of about {estimate} elements (at most {max_elements})')


def check_result(value: Any, where: str, max_elements: int | None = MAX_ELEMENTS) -> None:
    """Refuse a result too large to keep: a tensor past `max_elements` (None: unchecked), or an integer outside
    int64."""
    items = value if isinstance(value, tuple) else (value,)
    for v in items:
        if isinstance(v, torch.Tensor) and max_elements is not None and v.numel() > max_elements:
            raise GraphError(f'{where}: made a tensor of {v.numel()} elements (at most {max_elements})')
        if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**63:
            raise GraphError(f'{where}: made an integer outside int64')
        if isinstance(v, torch.Tensor) and v.is_complex():
            raise GraphError(f'{where}: complex tensors are not supported')


def read_attribute(obj: Any, name: str, where: str) -> Any:
    """`getattr(obj, name)` for a whitelisted tensor attribute."""
    if not isinstance(obj, torch.Tensor):
        raise GraphError(f'{where}: getattr reads tensor attributes only, got a {type(obj).__name__}')
    return builtins.getattr(obj, name)


@dataclass(frozen=True)
class Ref:
    """A reference to the value of an earlier node."""

    name: str


def resolve(value: Any, env: dict[str, Any]) -> Any:
    if isinstance(value, Ref):
        return env[value.name]
    if isinstance(value, list):
        return [resolve(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(resolve(v, env) for v in value)
    if isinstance(value, dict):
        return {k: resolve(v, env) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(resolve(value.start, env), resolve(value.stop, env), resolve(value.step, env))
    return value


class Decoder:
    """Decodes one node's encoded arguments, counting items and depth, checking references."""

    def __init__(self, defined: set[str], where: str, max_items: int, max_depth: int) -> None:
        self.defined, self.where, self.items = defined, where, 0
        self.max_items, self.max_depth = max_items, max_depth

    def __call__(self, value: Any, depth: int = 0) -> Any:
        self.items += 1
        if self.items > self.max_items or depth > self.max_depth:
            raise GraphError(f'{self.where}: arguments hold more than {self.max_items} values or nest too deeply')
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise GraphError(f'{self.where}: integer {value} is outside int64')
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, list):
            return [self(v, depth + 1) for v in value]
        if not (isinstance(value, dict) and len(value) == 1):
            raise GraphError(f'{self.where}: cannot decode argument {str(value)[:200]}')
        ((kind, inner),) = value.items()
        if kind == 'ref':
            if not isinstance(inner, str) or inner not in self.defined:
                raise GraphError(f'{self.where}: refers to {str(inner)[:130]!r}, which is not an earlier node')
            return Ref(inner)
        if kind == 'tuple' and isinstance(inner, list):
            return tuple(self(v, depth + 1) for v in inner)
        if kind == 'dict' and isinstance(inner, dict):
            return {str(k): self(v, depth + 1) for k, v in inner.items()}
        if kind == 'slice' and isinstance(inner, list) and len(inner) == 3:
            return slice(*(self(v, depth + 1) for v in inner))
        if kind == 'ellipsis' and inner is True:
            return Ellipsis
        try:
            return decode_constant(kind, inner)
        except GraphError as exc:
            raise GraphError(f'{self.where}: {exc}') from None
