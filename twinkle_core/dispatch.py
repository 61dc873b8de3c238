"""Distributed semantics of a component method, declared once on the interface (docs/architecture.md §2).

    class Model(ABC):
        @remote_method(dispatch='slice_dp', collect='mean')
        def forward_backward(self, *, inputs, **kwargs): ...

The local runtime ignores the declaration (the object is called directly). The Ray runtime and the HTTP
client build their proxies from `remote_methods(cls)`: which methods exist, how arguments are split across
data-parallel workers, and how results are collected. No hand-written mirror of every method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, TypeVar, get_args

from twinkle_core.mesh import split_for_dp  # noqa: F401 - re-exported: the runtimes' slicing rule

Dispatch = Literal['all', 'slice_dp', 'first']
Collect = Literal['first', 'mean', 'concat', 'list', 'none']

_F = TypeVar('_F', bound=Callable[..., Any])
_ATTR = '__twinkle_remote__'


#: ``row_kwargs(rows, kwargs)`` of a ``slice_dp`` method: see `RemoteSpec`
RowKwargs = Callable[[Any, dict[str, Any]], dict[str, list[Any]]]


@dataclass(frozen=True)
class RemoteSpec:
    """`dispatch`: 'all' = every worker gets the same call; 'slice_dp' = the `inputs` argument is split across
    data-parallel ranks; 'first' = only rank 0 runs it. `collect`: how per-worker results become one result.
    `mutates`: the call changes state (a runtime must not retry it blindly).

    `row_kwargs` (``slice_dp`` only): keyword arguments that hold one value per row of `inputs` and so must be split
    with it. A runtime that splits `inputs` over more than one data rank calls ``row_kwargs(inputs, kwargs)`` on the
    whole call (`kwargs`: its keyword arguments) and gives each rank the values of its rows for every keyword the
    returned dict names (one list entry per row); e.g. what a rank cannot compute from its slice alone. A runtime
    that does not split calls the method with the whole call and does not call it."""

    dispatch: Dispatch = 'all'
    collect: Collect = 'first'
    mutates: bool = True
    row_kwargs: RowKwargs | None = None


def remote_method(
    dispatch: Dispatch = 'all', collect: Collect = 'first', *, mutates: bool = True, row_kwargs: RowKwargs | None = None
) -> Callable[[_F], _F]:
    """Mark an interface method as callable through remote runtimes, with its dispatch/collect semantics (see
    `RemoteSpec`)."""
    if row_kwargs is not None and dispatch != 'slice_dp':
        raise ValueError(f"row_kwargs only applies to dispatch='slice_dp' (rows split across ranks), not {dispatch!r}.")
    spec = RemoteSpec(dispatch, collect, mutates, row_kwargs)

    def decorator(fn: _F) -> _F:
        setattr(fn, _ATTR, spec)
        return fn

    return decorator


def remote_methods(cls: type) -> dict[str, RemoteSpec]:
    """All remote methods of `cls` (inherited declarations included; an override keeps the base's spec)."""
    out: dict[str, RemoteSpec] = {}
    for klass in reversed(cls.__mro__):
        for name, attr in vars(klass).items():
            spec = getattr(attr, _ATTR, None)
            if spec is not None:  # an undecorated override keeps the base's declaration
                out[name] = spec
    return out


def collect_results(results: list[Any], how: Collect) -> Any:
    """Combine per-worker results according to `how`."""
    if how == 'none':
        return None
    if how == 'list':
        return results
    if how == 'first' or len(results) == 1:
        return results[0]
    if how == 'concat':
        first = results[0]
        if isinstance(first, list):
            return [x for r in results for x in r]
        if isinstance(first, dict):  # per-row values concatenate; scalars (already global, e.g. a loss) average
            return {
                k: collect_results([r[k] for r in results], 'mean' if _numeric(first[k]) else 'concat') for k in first
            }
        if first is None or isinstance(first, (str, bool)):
            return first
        import torch  # only reached for tensor results

        return torch.cat(results)
    if how == 'mean':
        first = results[0]
        if isinstance(first, dict):  # numbers (and nested dicts of numbers) average; per-row lists concatenate
            return {
                k: collect_results([r[k] for r in results], 'mean')
                if _numeric(first[k]) or isinstance(first[k], dict)
                else collect_results([r[k] for r in results], 'concat')
                if isinstance(first[k], list)
                else first[k]
                for k in first
            }
        return sum(results) / len(results)
    raise ValueError(f'unknown collect mode {how!r}; use one of {get_args(Collect)}.')


def _numeric(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
