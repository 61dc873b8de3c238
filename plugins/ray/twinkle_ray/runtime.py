"""The `ray` runtime: ``initialize(mode='ray', groups=[DeviceGroup(...)])`` hosts components on Ray actors.

    twinkle_core.initialize(mode='ray', groups=[DeviceGroup('model', ranks=2), DeviceGroup('sampler', ranks=1)])
    model = TransformersModel(model_id, remote_group='model')   # a proxy; 2 actors train data-parallel
    model.forward_backward(inputs=batch)                          # batch split across the 2 data ranks

Connects to a running cluster (``address='auto'`` / ``'ray://...'``, or ``RAY_ADDRESS``) or starts a local one
(``num_cpus``), also when another Ray instance runs on this machine (`ray_address`); a Ray instance that was already
initialised is reused and left running at shutdown. Shutdown kills the actors and removes the placement groups of
every device group.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from twinkle_core.errors import MeshError
from twinkle_core.mesh import DeviceGroup, DeviceMesh
from twinkle_core.runtime.base import Runtime

# Environment passed to every actor (Hugging Face offline switches, tokenizer threads, ...).
FORWARDED_ENV_PREFIXES = ('HF_', 'TRANSFORMERS_', 'TOKENIZERS_', 'TWINKLE_', 'OMP_NUM_THREADS', 'VLLM_')


def ray_address(address: str | None) -> str:
    """The ``ray.init(address=...)`` for `address`: itself, else ``RAY_ADDRESS`` (the cluster the environment names),
    else ``'local'``, a new local instance. (Ray's own default for no address joins an instance that already runs on
    this machine, another program's included, and then refuses ``num_cpus``.)"""
    return address or os.environ.get('RAY_ADDRESS') or 'local'


class RayRuntime(Runtime):
    name = 'ray'

    def __init__(self) -> None:
        self.groups: dict[str, Any] = {}  # name -> WorkerGroup
        self._default_mesh: DeviceMesh | None = None
        self._owns_ray = False
        self._lazy_collect = False

    def start(
        self,
        *,
        groups: list[DeviceGroup] | None = None,
        global_device_mesh: DeviceMesh | None = None,
        address: str | None = None,
        num_cpus: int | None = None,
        nproc_per_node: int | None = None,
        runtime_env: dict[str, Any] | None = None,
        lazy_collect: bool = False,
        **ray_init_kwargs: Any,
    ) -> None:
        """Connect to (or start) Ray and register `groups` (their actors start when a component first uses them).

        `nproc_per_node` sets each worker's ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (torchrun's meaning).
        `global_device_mesh`, when given, is the default mesh of a group of the same size. `lazy_collect`: the
        default for components built without their own ``lazy_collect=`` (True: calls return `LazyResult`s).
        """
        self._lazy_collect = lazy_collect
        import ray

        from twinkle_ray.group import WorkerGroup

        if not groups:
            raise MeshError(
                "the ray runtime needs device groups: initialize(mode='ray', groups=[DeviceGroup("
                "name='model', ranks=2), ...])."
            )
        names = [g.name for g in groups]
        if len(set(names)) != len(names):
            raise MeshError(f'device group names must be unique, got {names}.')
        if not ray.is_initialized():
            address = ray_address(address)
            if address == 'local' and num_cpus is None:  # a local instance: room for one actor per rank at least
                needed = sum(g.world_size * g.options.get('num_cpus', 1) for g in groups)
                num_cpus = max(os.cpu_count() or 1, int(needed + 0.999))
            ray.init(
                address=address,
                num_cpus=num_cpus,
                include_dashboard=False,
                runtime_env=runtime_env,
                log_to_driver=ray_init_kwargs.pop('log_to_driver', True),
                **ray_init_kwargs,
            )
            self._owns_ray = True
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
        self._default_mesh = global_device_mesh
        self.groups = {g.name: WorkerGroup(g, nproc_per_node=nproc_per_node, env=env) for g in groups}

    def build(
        self,
        cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        remote_group: str | None = None,
        device_mesh: DeviceMesh | None = None,
        lazy_collect: bool | None = None,
    ) -> Any:
        """Construct `cls` on every rank of `remote_group` and return its driver-side proxy."""
        if remote_group not in self.groups:
            raise MeshError(
                f'unknown device group {remote_group!r}; groups are {sorted(self.groups)}. Declare it in '
                "initialize(mode='ray', groups=[DeviceGroup(name=..., ranks=...)])."
            )
        group = self.groups[remote_group]
        if device_mesh is None and self._default_mesh is not None and self._default_mesh.world_size == group.world_size:
            device_mesh = self._default_mesh
        group.ensure_started(device_mesh)
        obj_id = group.construct(cls, args, kwargs)
        lazy = self._lazy_collect if lazy_collect is None else lazy_collect
        return _proxy_class(cls)(group, obj_id, lazy_collect=lazy)

    def weight_sync(self, model: Any, sampler: Any, **options: Any) -> Any | None:
        """`WeightSync` between a model and a sampler hosted in two device groups (broadcast over a side process
        group; `twinkle_ray.weight_sync`), or None when they are not both Ray proxies."""
        from twinkle_ray.proxy import ComponentProxy

        if not (isinstance(model, ComponentProxy) and isinstance(sampler, ComponentProxy)):
            return None
        from twinkle_ray.weight_sync import WeightSync

        return WeightSync(model, sampler, **options)

    def group(self, name: str) -> Any:
        """The `WorkerGroup` named `name` (its actors, mesh and placement group)."""
        if name not in self.groups:
            raise MeshError(f'unknown device group {name!r}; groups are {sorted(self.groups)}.')
        return self.groups[name]

    def reset_group(self, name: str) -> None:
        """Kill group `name`'s actors and free its placement group; the next `build` into it starts new actors
        (with a new mesh if asked). Its old components' proxies fail from then on."""
        self.group(name).reset()

    def shutdown(self) -> None:
        for group in self.groups.values():
            group.shutdown()
        self.groups = {}
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False


@functools.cache
def _proxy_class(cls: type) -> type:
    from twinkle_ray.proxy import make_proxy_class

    return make_proxy_class(cls)
