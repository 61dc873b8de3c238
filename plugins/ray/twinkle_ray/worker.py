"""`GroupWorker`: one rank of a device group, as a Ray actor.

Each worker is a torchrun-like SPMD process: it gets torchrun's environment variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and runs ``twinkle_core.initialize(mode='local',
global_device_mesh=<the group's mesh>)``, i.e. exactly the code path of a torchrun script. Components built into
the group are real objects living in every worker of the group, addressed by an id; the driver-side proxy calls
their methods through `call`. A method that raises comes back as `RemoteCallError` naming group, rank and method.
"""

from __future__ import annotations

import inspect
import os
import traceback
from typing import Any

from twinkle_core.runtime import distributed
from twinkle_core.utils.net import free_port
from twinkle_ray.errors import RemoteCallError


class GroupWorker:
    """Rank `rank` of device group `group` (``world_size`` ranks)."""

    def __init__(
        self,
        group: str,
        rank: int,
        world_size: int,
        local_rank: int,
        local_world_size: int,
        env: dict[str, str] | None = None,
    ) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size
        os.environ.update(
            {
                'RANK': str(rank),
                'WORLD_SIZE': str(world_size),
                'LOCAL_RANK': str(local_rank),
                'LOCAL_WORLD_SIZE': str(local_world_size),
                'TWINKLE_DEVICE_GROUP': group,
                **(env or {}),
            }
        )
        self.objects: dict[Any, Any] = {}  # components (by id) and runtime helpers (by key) living here
        self._iterators: dict[int, Any] = {}

    # ---- set-up ------------------------------------------------------------------------------------------------
    def rendezvous_address(self) -> tuple[str, int]:
        """(ip, free port) of this worker; rank 0's is the group's torch.distributed rendezvous."""
        import ray

        return ray.util.get_node_ip_address(), free_port('')

    def setup(self, master_addr: str, master_port: int, mesh: Any) -> None:
        """Join the group's process group (collective: every rank of the group calls it concurrently)."""
        os.environ.update({'MASTER_ADDR': master_addr, 'MASTER_PORT': str(master_port)})
        self._guard('setup', lambda: self._initialize(mesh))

    @staticmethod
    def _initialize(mesh: Any) -> None:
        import twinkle_core

        twinkle_core.initialize(mode='local', global_device_mesh=mesh)
        if not distributed.is_initialized():  # a 1-rank group: still give it a process group, like every group
            import torch.distributed as dist

            dist.init_process_group(
                distributed.default_backend(mesh.device_type), init_method='env://', rank=0, world_size=1
            )

    def construct(self, obj_id: int, payload: tuple[type, tuple[Any, ...], dict[str, Any], Any], mesh: Any) -> None:
        """Build ``cls(*args, **kwargs)`` from ``payload = (cls, args, kwargs, torch_rng_state)`` here, after
        setting torch's RNG state (when given); the group's mesh is passed as `device_mesh` if `cls` takes one and
        none was given."""
        cls, args, kwargs, rng_state = payload

        def build() -> Any:
            if rng_state is not None:
                import torch

                torch.set_rng_state(rng_state)
            kw = dict(kwargs)
            if kw.get('device_mesh') is None and _accepts(cls, 'device_mesh'):
                kw['device_mesh'] = mesh
            return cls(*args, **kw)

        self.objects[obj_id] = self._guard(f'{cls.__name__}.__init__', build)

    # ---- calls -------------------------------------------------------------------------------------------------
    def call(
        self,
        obj_id: int,
        method: str,
        arguments: tuple[tuple[Any, ...], dict[str, Any]],
        inputs: Any = None,
        inputs_at: str | int | None = None,
        row_kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """``obj.method(*args, **kwargs)`` (``arguments = (args, kwargs)``), with `inputs` placed at `inputs_at`
        (a keyword or a positional index) when given, and this rank's per-row keywords (`RemoteSpec.row_kwargs`)
        added to `kwargs`.

        `inputs` travels as a top-level Ray argument, so an ObjectRef there (e.g. a batch produced in this group)
        is resolved here without passing through the driver.
        """
        obj, (args, kwargs) = self.objects[obj_id], arguments
        if row_kwargs:
            kwargs = {**kwargs, **row_kwargs}
        if isinstance(inputs_at, str):
            kwargs = {**kwargs, inputs_at: inputs}
        elif isinstance(inputs_at, int):
            args = (*args[:inputs_at], inputs, *args[inputs_at:])
        return self._guard(f'{type(obj).__name__}.{method}', lambda: getattr(obj, method)(*args, **kwargs))

    def start_iteration(self, obj_id: int) -> None:
        obj = self.objects[obj_id]
        self._iterators[obj_id] = self._guard(f'iter({type(obj).__name__})', lambda: iter(obj))

    def next_item(self, obj_id: int) -> tuple[bool, Any]:
        """(exhausted, item) of the iterator `start_iteration` opened; item stays in the object store."""
        iterator, end = self._iterators[obj_id], object()
        item = self._guard(f'next({type(self.objects[obj_id]).__name__})', lambda: next(iterator, end))
        if item is end:
            self._iterators.pop(obj_id, None)
            return True, None
        return False, item

    def run(self, fn: Any, *args: Any) -> Any:
        """Runtime plumbing (e.g. weight sync): ``fn(self, *args)`` with access to `objects`."""
        name = getattr(fn, '__qualname__', repr(fn))
        return self._guard(name, lambda: fn(self, *args))

    def release(self, obj_id: int) -> None:
        self.objects.pop(obj_id, None)
        self._iterators.pop(obj_id, None)

    def ping(self) -> int:
        return self.rank

    def _guard(self, method: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - re-raised with the actor's identity
            raise RemoteCallError(
                self.group, self.rank, method, f'{type(e).__name__}: {e}', traceback.format_exc()
            ) from None


def _accepts(cls: type[object], name: str) -> bool:
    try:
        params = inspect.signature(cls.__init__).parameters  # not cls: its metaclass has __call__
    except (TypeError, ValueError):
        return False
    return name in params
