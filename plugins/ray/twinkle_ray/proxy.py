"""Driver-side proxies of components hosted in a device group, built from the interface's `remote_method`s.

A proxy method fans a call out to the group's ranks as its `RemoteSpec` says -- ``all`` (every rank, same
arguments), ``slice_dp`` (the `inputs` argument split into contiguous slices, one per data rank; tensor-parallel
peers get the same slice), ``first`` (rank 0 only) -- and combines the per-rank results with
`twinkle_core.dispatch.collect_results` over the data-leader ranks (one per data shard).

Results come back as values, or with ``lazy_collect=True`` as a `LazyResult` that is only fetched when used.
A `LazyResult` of one group passed as `inputs` to a ``slice_dp`` method of the same group goes rank to rank
(each rank gets its own part), so e.g. batches of a lazily collected `DataLoader` hosted in the model group never
reach the driver -- unless the method declares per-row keywords (`RemoteSpec.row_kwargs`, e.g. `Sampler.sample`'s
``occurrences``), which are computed here over the whole call.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterator

import ray

from twinkle_core.dispatch import Collect, RemoteSpec, collect_results, remote_methods
from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.mesh import split_for_dp
from twinkle_ray.group import WorkerGroup

INPUTS = 'inputs'


class LazyResult:
    """Per-rank results of one call, combined (``collect``) on first use and cached.

    Use `result()`, or use it as the value: indexing, iteration, ``len``, ``float``, comparisons, attribute
    access and ``repr`` all fetch it.
    """

    def __init__(
        self, group: WorkerGroup, refs: list[Any], collect: Collect, method: str, collect_ranks: list[int] | None = None
    ) -> None:
        self._group, self._refs, self._collect, self._method = group, refs, collect, method
        self._collect_ranks = collect_ranks if collect_ranks is not None else list(range(len(refs)))
        self._value: Any = None
        self._done = False

    @property
    def group(self) -> WorkerGroup:
        return self._group

    @property
    def refs(self) -> list[Any]:
        """One Ray ObjectRef per rank of the group (rank order)."""
        return list(self._refs)

    def done(self) -> bool:
        """True once every rank has finished (never blocks)."""
        ready, _ = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)

    def result(self) -> Any:
        """Wait for every rank, raise the first failure, and return the collected value."""
        if not self._done:
            values = self._group.wait(self._refs, self._method)
            picked = [values[r] for r in self._collect_ranks]
            self._value = collect_results(picked, self._collect)
            self._done = True
        return self._value

    def __getattr__(self, name: str) -> Any:
        if name.startswith('_'):
            raise AttributeError(name)
        return getattr(self.result(), name)

    def __getitem__(self, key: Any) -> Any:
        return self.result()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.result())

    def __len__(self) -> int:
        return len(self.result())

    def __contains__(self, item: Any) -> bool:
        return item in self.result()

    def __float__(self) -> float:
        return float(self.result())

    def __int__(self) -> int:
        return int(self.result())

    def __bool__(self) -> bool:
        return bool(self.result())

    def __eq__(self, other: Any) -> bool:
        return self.result() == (other.result() if isinstance(other, LazyResult) else other)

    __hash__ = None  # type: ignore[assignment]

    def __format__(self, spec: str) -> str:
        return format(self.result(), spec)

    def __repr__(self) -> str:
        if not self._done and not self.done():
            return f'<LazyResult of {self._method} on group {self._group.name!r}: pending>'
        return repr(self.result())


class ComponentProxy:
    """Base of the generated proxy classes; one proxy = one component hosted in every rank of a group."""

    _twinkle_cls: type = object
    _twinkle_specs: dict[str, RemoteSpec] = {}

    def __init__(self, group: WorkerGroup, obj_id: int, *, lazy_collect: bool = False) -> None:
        self._group, self._obj_id, self._lazy = group, obj_id, lazy_collect

    @property
    def device_group(self) -> str:
        return self._group.name

    @property
    def device_mesh(self) -> Any:
        return self._group.mesh

    def __getattr__(self, name: str) -> Any:
        if name.startswith('_'):
            raise AttributeError(name)
        cls = self._twinkle_cls
        what = 'is not declared with @remote_method' if hasattr(cls, name) else 'is not a method of the class'
        raise AttributeError(
            f'{cls.__name__}.{name} {what}, so it cannot be reached on a component hosted in device '
            f'group {self._group.name!r}. Remote methods: {sorted(self._twinkle_specs)}; declare '
            'others on the interface (twinkle_core.dispatch.remote_method) with dispatch/collect.'
        )

    def __repr__(self) -> str:
        return f'<{self._twinkle_cls.__name__} proxy on group {self._group.name!r} ({self._group.mesh!r})>'

    # ---- calls -------------------------------------------------------------------------------------------------
    def _twinkle_invoke(self, name: str, spec: RemoteSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        group = self._group
        group.check_usable()
        ranks = [0] if spec.dispatch == 'first' else list(range(group.world_size))
        per_rank_inputs, inputs_at = [None] * len(ranks), None
        per_rank_kwargs: list[dict[str, Any] | None] = [None] * len(ranks)
        if spec.dispatch == 'slice_dp':
            args, kwargs, inputs, inputs_at = _pop_inputs(self._twinkle_cls, name, args, kwargs)
            per_rank_inputs, per_rank_kwargs, kwargs = self._slice_call(inputs, kwargs, name, spec)
        arguments = ray.put((args, kwargs))
        refs = [
            group.workers[r].call.remote(
                self._obj_id, name, arguments, per_rank_inputs[i], inputs_at, per_rank_kwargs[i]
            )
            for i, r in enumerate(ranks)
        ]
        mesh = group.mesh
        collect_ranks = (
            [0]
            if spec.collect == 'first'
            else [i for i, r in enumerate(ranks) if mesh is None or mesh.is_data_leader(r)]
        )
        result = LazyResult(group, refs, spec.collect, f'{self._twinkle_cls.__name__}.{name}', collect_ranks)
        return result if self._lazy else result.result()

    def _slice_call(
        self, inputs: Any, kwargs: dict[str, Any], method: str, spec: RemoteSpec
    ) -> tuple[list[Any], list[dict[str, Any] | None], dict[str, Any]]:
        """Per rank, its `inputs` and its entries of the method's per-row keywords (`RemoteSpec.row_kwargs`,
        computed over the whole call when it is split over several data ranks), and the keywords every rank
        shares."""
        group, mesh, row_kwargs = self._group, self._group.started_mesh, spec.row_kwargs
        if row_kwargs is None or mesh.data_world_size == 1:
            return self._slice_inputs(inputs, method), [None] * group.world_size, kwargs
        if isinstance(inputs, LazyResult):  # the per-row keywords need the whole call: fetched, then split here
            inputs = inputs.result()
        slices = self._slice_inputs(inputs, method)  # checks that `inputs` is a list of enough rows
        per_row = row_kwargs(inputs, kwargs)
        for key, values in per_row.items():
            if len(values) != len(inputs):
                raise InvalidInputError(
                    f'{self._twinkle_cls.__name__}.{method}: `{key}` has {len(values)} entries for {len(inputs)} '
                    'rows; give one per row.'
                )
        parts = {key: split_for_dp(values, mesh.data_world_size) for key, values in per_row.items()}
        shared = {k: v for k, v in kwargs.items() if k not in per_row}
        return slices, [{k: p[mesh.data_rank(r)] for k, p in parts.items()} for r in range(group.world_size)], shared

    def _slice_inputs(self, inputs: Any, method: str) -> list[Any]:
        """One entry per rank: that rank's data slice (an ObjectRef shared by its tensor-parallel peers)."""
        group, mesh = self._group, self._group.started_mesh
        if isinstance(inputs, LazyResult):
            if inputs.group is group and len(inputs.refs) == group.world_size:
                return inputs.refs  # produced rank by rank in this group: each rank keeps its own part
            inputs = inputs.result()
        mixed = getattr(getattr(self._twinkle_cls, 'capabilities', None), 'mixed_adapters', False)
        if mixed and isinstance(inputs, dict) and 'input_ids' not in inputs:  # {adapter_name: rows} (`Model`)
            return self._slice_tenants(inputs, method)
        if not isinstance(inputs, (list, tuple)):
            raise InvalidInputError(
                f'{self._twinkle_cls.__name__}.{method} splits `inputs` across the '
                f'{mesh.data_world_size} data ranks of group {group.name!r}, so it must be a '
                f'list of rows; got {type(inputs).__name__}.'
            )
        if len(inputs) < mesh.data_world_size:
            raise InvalidInputError(
                f'{self._twinkle_cls.__name__}.{method}: {len(inputs)} rows cannot be split across '
                f'{mesh.data_world_size} data ranks of group {group.name!r}; pass at least '
                f'{mesh.data_world_size} rows (a multiple of it balances the ranks).'
            )
        slices = [ray.put(s) for s in split_for_dp(list(inputs), mesh.data_world_size)]
        return [slices[mesh.data_rank(r)] for r in range(group.world_size)]

    def _slice_tenants(self, inputs: dict[str, Any], method: str) -> list[Any]:
        """``{adapter_name: rows}`` (a multi-tenant call): each tenant's rows split across the data ranks; a tenant
        with fewer rows than ranks leaves some ranks none of its rows (the model combines the ranks per tenant)."""
        group, mesh = self._group, self._group.started_mesh
        for name, rows in inputs.items():
            if not isinstance(rows, (list, tuple)):
                raise InvalidInputError(
                    f'{self._twinkle_cls.__name__}.{method}: inputs[{name!r}] must be a list of rows (inputs is '
                    f'{{adapter_name: rows}}); got {type(rows).__name__}.'
                )
        parts = {name: split_for_dp(list(rows), mesh.data_world_size) for name, rows in inputs.items()}
        slices = [ray.put({name: p[d] for name, p in parts.items()}) for d in range(mesh.data_world_size)]
        return [slices[mesh.data_rank(r)] for r in range(group.world_size)]

    def _twinkle_iterate(self) -> Iterator[Any]:
        """Iterate the hosted component on every rank. With ``lazy_collect=True`` each item stays in the group (a
        `LazyResult`, handed rank to rank to a ``slice_dp`` method of the same group); otherwise it is fetched
        (the ranks' parts concatenated), like every other call's result."""
        group, obj_id, what = self._group, self._obj_id, f'iter({self._twinkle_cls.__name__})'
        group.check_usable()
        group.wait([w.start_iteration.remote(obj_id) for w in group.workers], what)
        leaders = [r for r in range(group.world_size) if group.started_mesh.is_data_leader(r)]
        while True:
            pairs = [w.next_item.options(num_returns=2).remote(obj_id) for w in group.workers]
            exhausted = group.wait([p[0] for p in pairs], what)
            if all(exhausted):
                return
            if any(exhausted):
                raise TwinkleError(
                    f'{what} in group {group.name!r}: ranks {[r for r, e in enumerate(exhausted) if e]} '
                    'ran out of items before the others; every rank must yield the same number.'
                )
            item = LazyResult(group, [p[1] for p in pairs], 'concat', what, leaders)
            yield item if self._lazy else item.result()


def _pop_inputs(
    cls: type, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], Any, str | int]:
    """Remove the `inputs` argument from a call; return the rest, its value and where it goes back."""
    if INPUTS in kwargs:
        rest = dict(kwargs)
        return args, rest, rest.pop(INPUTS), INPUTS
    params = [p for p in inspect.signature(getattr(cls, name)).parameters.values()][1:]  # drop self
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if INPUTS in positional and positional.index(INPUTS) < len(args):
        i = positional.index(INPUTS)
        return args[:i] + args[i + 1 :], kwargs, args[i], i
    raise InvalidInputError(f'{cls.__name__}.{name} needs `inputs` (the rows to split across data ranks).')


def make_proxy_class(cls: type) -> type[ComponentProxy]:
    """A `ComponentProxy` subclass with one method per `remote_method` of `cls` (and iteration if `cls` iterates)."""
    specs = remote_methods(cls)
    namespace: dict[str, Any] = {
        '_twinkle_cls': cls,
        '_twinkle_specs': specs,
        '__module__': __name__,
        '__doc__': f'Proxy of {cls.__qualname__} hosted in a Ray device group.',
    }
    for name, spec in specs.items():
        namespace[name] = _proxy_method(cls, name, spec)
    if hasattr(cls, '__iter__'):
        namespace['__iter__'] = ComponentProxy._twinkle_iterate
    return type(f'{cls.__name__}Proxy', (ComponentProxy,), namespace)


def _proxy_method(cls: type, name: str, spec: RemoteSpec) -> Callable[..., Any]:
    target = getattr(cls, name)

    @functools.wraps(target)
    def method(self: ComponentProxy, *args: Any, **kwargs: Any) -> Any:
        return self._twinkle_invoke(name, spec, args, kwargs)

    return method
