"""Graceful drain before shutdown: take no new work, let accepted work finish, fail what is left clearly.

`Drain.start` (on SIGTERM/SIGINT: `launch.serve`; or `RunningServer.drain`) moves the service from serving to
draining. From then on `DrainGate` (`api/drain_gate.py`) answers 503 "server is draining" (with Retry-After) to
every request except collecting results (`retrieve_future`, `retrieve_futures`), heartbeats, telemetry and
`/metrics`; `/api/v1/healthz` answers 503 too, so a load balancer stops routing here. Accepted work — queued or
running model-host work, and requests already being handled — finishes, for at most `drain_timeout_s`. Parked work
waiting for a seq_id that can no longer arrive (no request is in flight) is failed at once. At the deadline, work
still queued is failed with `SHUTDOWN_QUEUED` and work still running with `SHUTDOWN_RUNNING`: every future gets a
definite answer, recorded in the store, so a client polling it — here, or on a restarted server with the same data
dir — never hangs. Then the server shuts down.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Callable

from twinkle_server.errors import ApiError

if TYPE_CHECKING:
    from twinkle_server.engine.scheduler import ModelWorker
    from twinkle_server.service.futures import FutureTable

logger = logging.getLogger(__name__)

SHUTDOWN_QUEUED = 'server shut down before this request ran; retry on another server'
SHUTDOWN_RUNNING = 'server shut down before this request finished; retry on another server'
DRAINING = (
    'server is draining (shutting down): it accepts no new work; retry shortly, or on another server '
    '(results of accepted requests can still be retrieved here until it stops)'
)
POLL_S = 0.05


class Drain:
    """The drain of one service: `serving` -> `draining` -> `drained`. Its methods run on the event loop."""

    def __init__(self, workers: dict[str, ModelWorker], futures: FutureTable, timeout_s: float) -> None:
        self.workers = workers
        self.futures = futures
        self.timeout_s = timeout_s
        self.state = 'serving'
        self.in_flight = 0  # requests admitted by DrainGate and not answered yet (they may still queue work)
        self._deadline: float | None = None
        self._task: asyncio.Task | None = None

    @property
    def draining(self) -> bool:
        return self.state != 'serving'

    def start(self, on_done: Callable[[], Any] | None = None) -> bool:
        """Begin draining (call on the event loop); `on_done()` runs when it is over, typically to shut the server
        down. False (and nothing done) when a drain already started."""
        if self.draining:
            return False
        self.state = 'draining'
        self._deadline = time.monotonic() + self.timeout_s
        self._task = asyncio.get_running_loop().create_task(self._run(on_done))
        return True

    def refusal(self) -> ApiError:
        """The 503 a request gets while the server drains."""
        left = max(1.0, (self._deadline or time.monotonic()) - time.monotonic())
        return ApiError(503, DRAINING, retry_after_s=math.ceil(left))

    def fail_queued(self) -> int:
        """Fail all queued and parked work; the workers refuse later submissions. Returns how many failed."""
        return sum(w.abandon(ApiError(503, SHUTDOWN_QUEUED), DRAINING) for w in self.workers.values())

    def fail_running(self) -> int:
        """Fail every future still unanswered (work running now, or accepted and not queued yet)."""
        return self.futures.fail_pending(ApiError(503, SHUTDOWN_RUNNING))

    def _settled(self) -> bool:
        """Nothing accepted is left to finish (failing parked work whose missing seq_id can no longer come)."""
        if self.in_flight:
            return False
        for worker in self.workers.values():
            worker.fail_gaps(ApiError(503, SHUTDOWN_QUEUED))
        return all(w.idle() for w in self.workers.values())

    async def _run(self, on_done: Callable[[], Any] | None) -> None:
        started = time.monotonic()
        logger.warning(
            'draining: accepting no new work; waiting up to %g s for %d accepted request(s)',
            self.timeout_s,
            self.futures.pending_total(),
        )
        try:
            while not self._settled() and time.monotonic() < (self._deadline or 0):
                await asyncio.sleep(POLL_S)
            queued, running = self.fail_queued(), self.fail_running()
            if queued or running:
                logger.warning(
                    'drain timed out after %.1f s: failed %d queued and %d running request(s)',
                    time.monotonic() - started,
                    queued,
                    running,
                )
            else:
                logger.info('drained in %.1f s: all accepted work finished', time.monotonic() - started)
        except Exception:  # noqa: BLE001 - the server must still shut down
            logger.exception('drain failed')
        finally:
            self.state = 'drained'
            if on_done is not None:
                on_done()
