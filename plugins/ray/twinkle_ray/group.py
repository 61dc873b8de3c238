"""`WorkerGroup`: the Ray actors of one `DeviceGroup`, placed by one placement group, one actor per rank.

The actors start on the first component built into the group (its `device_mesh`, or data-parallel over all
ranks, fixes the group's mesh), join one torch.distributed process group, and host every component built into the
group. `wait` collects a call's per-rank results and turns the first failure into `RemoteCallError`; a failure
that leaves other ranks running or stuck (e.g. inside a collective) marks the group broken.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from twinkle_core.errors import MeshError, TwinkleError
from twinkle_core.mesh import DeviceGroup, DeviceMesh
from twinkle_ray.errors import GroupBrokenError, RemoteCallError
from twinkle_ray.worker import GroupWorker

PLACEMENT_TIMEOUT_S = 120.0
FAILURE_GRACE_S = 2.0  # after one rank fails, how long to wait for the others before declaring the group broken


class WorkerGroup:
    """The actors of `spec`. ``spec.options`` may set ``num_cpus`` / ``num_gpus`` per rank and ``env`` vars."""

    def __init__(
        self, spec: DeviceGroup, *, nproc_per_node: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.world_size = spec.world_size
        self.nproc_per_node = nproc_per_node or self.world_size
        self.env = {**(env or {}), **spec.options.get('env', {})}
        self.mesh: DeviceMesh | None = None
        self.workers: list[Any] = []
        self.placement_group: Any = None
        self.broken: str | None = None
        self._ids = itertools.count(1)

    # ---- life cycle --------------------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return bool(self.workers)

    @property
    def started_mesh(self) -> DeviceMesh:
        """The group's mesh, fixed by `ensure_started` (components and their proxies only exist after it)."""
        if self.mesh is None:
            raise TwinkleError(f'device group {self.name!r} has not started: build a component into it first.')
        return self.mesh

    def ensure_started(self, mesh: DeviceMesh | None) -> None:
        """Start the actors with `mesh` (default: data parallel over all ranks); later meshes must match it."""
        if self.started:
            if mesh is not None and mesh != self.mesh:
                raise MeshError(
                    f'device group {self.name!r} already runs with {self.mesh!r}; a component asked for '
                    f'{mesh!r}. Components of one group share its mesh: omit device_mesh or use a '
                    'separate DeviceGroup.'
                )
            return
        device_type = self.spec.device_type
        mesh = mesh or DeviceMesh.from_sizes(dp_size=self.world_size, device_type=device_type)
        if mesh.world_size != self.world_size:
            raise MeshError(
                f'{mesh!r} has {mesh.world_size} ranks but device group {self.name!r} has '
                f'{self.world_size}; size the mesh to the group.'
            )
        resources = self._rank_resources()
        total = ray.cluster_resources()
        short = {k: v * self.world_size for k, v in resources.items() if v * self.world_size > total.get(k, 0)}
        if short:
            raise TwinkleError(
                f'device group {self.name!r} needs {self.world_size} x {resources} but the whole Ray '
                f'cluster has {{{", ".join(f"{k!r}: {total.get(k, 0)}" for k in short)}}}. Add '
                "resources (e.g. ray.init(num_cpus=...)), or lower the group's ranks or its "
                "options['num_cpus']."
            )
        self.placement_group = placement_group(
            [dict(resources) for _ in range(self.world_size)], strategy='PACK', name=f'twinkle-{self.name}-{id(self):x}'
        )
        try:
            ray.get(self.placement_group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except GetTimeoutError:
            self.shutdown()
            raise TwinkleError(
                f'device group {self.name!r} needs {self.world_size} x {resources} but the Ray cluster '
                f'could not place them within {PLACEMENT_TIMEOUT_S:.0f}s (available: '
                f'{ray.available_resources()}). Add resources or shrink the group.'
            ) from None
        actor_cls = ray.remote(GroupWorker)
        self.workers = [
            actor_cls.options(
                num_cpus=resources.get('CPU', 0),
                num_gpus=resources.get('GPU', 0),
                resources={k: v for k, v in resources.items() if k not in ('CPU', 'GPU')} or None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=rank
                ),
                runtime_env={'env_vars': self.env} if self.env else None,
            ).remote(self.name, rank, self.world_size, rank % self.nproc_per_node, self.nproc_per_node, self.env)
            for rank in range(self.world_size)
        ]
        self.mesh = mesh
        addr, port = ray.get(self.workers[0].rendezvous_address.remote())
        self.wait([w.setup.remote(addr, port, mesh) for w in self.workers], 'setup')

    def _rank_resources(self) -> dict[str, float]:
        """One rank's bundle: ``num_cpus`` (default 1), ``num_gpus`` (default 1 on CUDA) and any custom Ray
        resources in ``options['resources']`` (e.g. ``{'node_b': 1}`` to pin the group to nodes offering it)."""
        opts = self.spec.options
        gpus = opts.get('num_gpus', 1 if self.spec.device_type == 'cuda' else 0)
        res = {'CPU': float(opts.get('num_cpus', 1))}
        if gpus:
            res['GPU'] = float(gpus)
        res.update({str(k): float(v) for k, v in (opts.get('resources') or {}).items()})
        return res

    def shutdown(self) -> None:
        """Kill the actors and remove the placement group (safe to call twice, and on a broken group)."""
        for worker in self.workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.workers = []
        if self.placement_group is not None:
            try:
                remove_placement_group(self.placement_group)
            except Exception:  # noqa: BLE001 - already removed
                pass
            self.placement_group = None

    def reset(self) -> None:
        """`shutdown`, and forget the mesh and any broken state: the group can start again from scratch."""
        self.shutdown()
        self.mesh, self.broken = None, None

    # ---- components --------------------------------------------------------------------------------------------
    def construct(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """Build ``cls(*args, **kwargs)`` on every rank, starting from the driver's torch RNG state; returns the
        component's id within the group."""
        self.check_usable()
        obj_id = next(self._ids)
        payload = ray.put((cls, args, kwargs, _driver_rng_state()))
        self.wait([w.construct.remote(obj_id, payload, self.mesh) for w in self.workers], f'{cls.__name__}.__init__')
        return obj_id

    def check_usable(self) -> None:
        if self.broken:
            raise GroupBrokenError(
                f'device group {self.name!r} is unusable: {self.broken}. Its ranks may be stuck in '
                'a collective; call twinkle_core.shutdown() (or initialize again) to release it.'
            )

    # ---- results -----------------------------------------------------------------------------------------------
    def wait(self, refs: list[Any], method: str) -> list[Any]:
        """Per-rank values of `refs` (one per rank, in rank order); the first failure raises `RemoteCallError`."""
        return wait_across([(self, refs, method)])[0]

    def _as_remote_error(self, exc: Exception, rank: int, method: str) -> RemoteCallError:
        cause = getattr(exc, 'cause', None)
        if isinstance(cause, RemoteCallError):
            return RemoteCallError(cause.group, cause.rank, cause.method, cause._message(), cause.remote_traceback)
        if isinstance(exc, RayActorError):
            return RemoteCallError(self.name, rank, method, f'the actor died ({type(exc).__name__}: {exc})')
        return RemoteCallError(self.name, rank, method, f'{type(exc).__name__}: {exc}')

    def _mark_broken_unless_all_failed(self, refs: list[Any], error: RemoteCallError) -> None:
        """One rank failing while others succeed or hang leaves the group inconsistent; all failing does not."""
        done, pending = ray.wait(list(refs), num_returns=len(refs), timeout=FAILURE_GRACE_S)
        all_failed = not pending and all(_failed(r) for r in done)
        if not all_failed:
            self.broken = f'{error.method} failed on rank {error.rank} while other ranks did not'


def _driver_rng_state() -> Any:
    """The driver's torch CPU RNG state (None if torch is not imported): components are built from it in the
    actors, so a script that seeds torch gets the same initial weights (e.g. LoRA) as when it builds them here."""
    torch = sys.modules.get('torch')
    return torch.get_rng_state() if torch is not None else None


def wait_across(calls: list[tuple[WorkerGroup, list[Any], str]]) -> list[list[Any]]:
    """Values of several groups' concurrent calls ``(group, per-rank refs, method)``, as soon as all finish; the
    first failure anywhere raises `RemoteCallError` (and marks its group broken unless all its ranks failed)."""
    where = {ref: (group, rank, method, refs) for group, refs, method in calls for rank, ref in enumerate(refs)}
    pending = list(where)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except (RayTaskError, RayActorError) as exc:
            group, rank, method, refs = where[ready[0]]
            error = group._as_remote_error(exc, rank, method)
            group._mark_broken_unless_all_failed(refs, error)
            raise error from None
    return [ray.get(list(refs)) for _, refs, _ in calls]


def _failed(ref: Any) -> bool:
    try:
        ray.get(ref)
        return False
    except Exception:  # noqa: BLE001
        return True
