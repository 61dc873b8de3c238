"""`HostedGroup`: one host object on every rank of a Ray device group, that can be rebuilt after its actors die.

Built on `twinkle_ray.group.WorkerGroup` (placement group, one actor per rank, a torch.distributed process group
per device group). A call goes to every rank and returns the per-rank `Outcome`s; when Ray reports a failure, the
group checks whether its actors are still alive, so callers can tell "the call failed" (an error inside the host,
carried in the outcome) from "the workers are gone" (`WorkersLost`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from twinkle_core.errors import TwinkleError
from twinkle_core.mesh import DeviceGroup, DeviceMesh

logger = logging.getLogger(__name__)

PING_TIMEOUT_S = 10.0


class WorkersLost(TwinkleError):
    """The actors of a hosted group died (or stopped answering) during a call."""


class HostedGroup:
    """`cls(*args, **kwargs)` on every rank of `spec`, with the group's `mesh` passed as ``device_mesh``."""

    def __init__(
        self,
        spec: DeviceGroup,
        mesh: DeviceMesh | None,
        cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        env: dict[str, str],
    ) -> None:
        self.spec, self.mesh, self.cls, self.args, self.kwargs, self.env = spec, mesh, cls, args, kwargs, env
        self.group: Any = None
        self.obj_id: int | None = None
        self.restarts = 0
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.spec.name

    def start(self) -> None:
        """Start the actors and build the host on each rank (blocking; raises if the host cannot be built)."""
        from twinkle_ray.group import WorkerGroup

        group = WorkerGroup(self.spec, env=self.env)
        try:
            group.ensure_started(self.mesh)
            self.obj_id = group.construct(self.cls, self.args, dict(self.kwargs))
        except BaseException:
            group.shutdown()
            raise
        self.group = group

    def restart(self) -> None:
        """Replace the actors (after `WorkersLost`): kill what is left, start fresh ones."""
        with self._lock:
            self.shutdown()
            self.restarts += 1
            logger.warning('restarting device group %r (restart %d)', self.name, self.restarts)
            self.start()

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.shutdown()
        self.group, self.obj_id = None, None

    @property
    def actors(self) -> list[Any]:
        """The Ray actor handles, rank order (e.g. for health checks or fault-injection tests)."""
        return list(self.group.workers) if self.group is not None else []

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start `method` on every rank; returns the per-rank Ray object refs (see `collect`)."""
        import ray

        if self.group is None:
            raise WorkersLost(f'device group {self.name!r} is not running')
        arguments = ray.put((args, kwargs))
        return [w.call.remote(self.obj_id, method, arguments) for w in self.group.workers]

    def collect(self, refs: list[Any], method: str) -> list[Any]:
        """Per-rank outcomes of `submit`'s refs; raises `WorkersLost` when an actor died on the way."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return ray.get(refs)
        except (RayActorError, RayTaskError) as exc:
            if self.alive():
                raise
            raise WorkersLost(
                f'the workers of device group {self.name!r} died during {method} ({type(exc).__name__})'
            ) from exc

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """`submit` + `collect`."""
        return self.collect(self.submit(method, *args, **kwargs), method)

    def alive(self) -> bool:
        """True when every actor answers a ping within `PING_TIMEOUT_S`."""
        import ray

        if self.group is None or not self.group.workers:
            return False
        try:
            ray.get([w.ping.remote() for w in self.group.workers], timeout=PING_TIMEOUT_S)
            return True
        except Exception:  # noqa: BLE001 - dead, unreachable or stuck: all mean "restart"
            return False
