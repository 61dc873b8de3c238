"""One worker thread per base model: seq_id ordering per training model, fair round-robin across tenants,
and batching of compatible work (forward/backward passes of different adapters; samples) into one call of its
model host.

- A training model's requests carry `seq_id` 1, 2, 3...; they may arrive out of order (the SDK posts chunks
  concurrently). Work with seq_id `n` is parked until `n - 1` has finished, so each model runs strictly in order.
  A seq_id refused before it was queued is skipped (`skip`); work that waits longer than `seq_gap_timeout_s` for a
  seq_id that never arrives is failed with an error naming the missing id, and the sequence moves on past it.
- Ready work waits in one queue per tenant; the worker serves tenants in rotation, so one tenant's long queue
  never starves another.
- When the picked work is a forward/backward, the heads of the other tenants' queues that are also
  forward/backward passes (of other adapters) join the same host call: one mixed-tenant pass.
  Sample jobs are batched the same way.
- All torch work happens on this thread; the event loop only enqueues.
- Every host call is timed and its tokens counted (`metrics.Metrics`), and runs with the log context of the
  requests it serves (`logs.bound`). For a drain, `fail_gaps` and `abandon` fail work that can no longer run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from typing import Iterator

from twinkle_core.hooks import emit_failure
from twinkle_server import logs
from twinkle_server.engine.model_host.base import ModelHost
from twinkle_server.engine.work import KINDS, SeqState, Work, host_call, tokens_of
from twinkle_server.errors import ApiError
from twinkle_server.metrics import Metrics

logger = logging.getLogger(__name__)

__all__ = ['ModelWorker', 'Work']


class ModelWorker:
    """Executes one model host's work queue on a dedicated thread."""

    def __init__(
        self,
        host: ModelHost,
        *,
        max_queued_samples: int = 256,
        max_batch: int = 16,
        seq_gap_timeout_s: float = 120.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.host = host
        self.metrics = metrics if metrics is not None else Metrics()
        self.max_queued_samples = max_queued_samples
        self.max_batch = max_batch
        self.seq_gap_timeout_s = seq_gap_timeout_s
        self._ready: OrderedDict[str, deque[Work]] = OrderedDict()
        self._sequences: dict[str, SeqState] = {}
        self._queued_samples = 0
        self._running: list[Work] = []  # the batch in the host call now
        self._refusal: str | None = None  # set by `abandon`: why submissions are refused from now on
        #: counters for monitoring (and tests): host passes, and how many of them mixed several adapters
        self.stats = {
            'train_passes': 0,
            'mixed_train_passes': 0,
            'max_adapters_per_pass': 0,
            'sample_passes': 0,
            'cancelled_queued_samples': 0,
            'cancelled_running_samples': 0,
        }
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name=f'twinkle-worker[{host.base_model}]', daemon=True)
        self._thread.start()

    # ---- submission (event loop) ---------------------------------------------------------------------------
    def start_sequence(self, model_id: str, next_seq: int = 1) -> None:
        with self._cond:
            self._sequences[model_id] = SeqState(next_seq)

    def end_sequence(self, model_id: str) -> None:
        with self._cond:
            seq = self._sequences.pop(model_id, None)
        for work in seq.parked.values() if seq else ():
            self._fail(work, ApiError(404, f'model {model_id!r} was unloaded before this request ran'))

    def submit(self, work: Work) -> None:
        """Queue `work`; raises ApiError 429 when the sample queue is full, 400 for a used seq_id, 503 once the
        worker was abandoned (shutdown). Takes the caller's log context into `work.context`."""
        if work.context is None:
            work.context = logs.snapshot(model=self.host.base_model)
        with self._cond:
            if self._refusal is not None:
                raise ApiError(503, self._refusal)
            if work.sample is not None:
                if self._queued_samples >= self.max_queued_samples:
                    raise ApiError(
                        429,
                        f'sampling queue of {self.host.base_model!r} is full '
                        f'({self.max_queued_samples} requests); retry shortly',
                    )
                self._queued_samples += 1
            if work.model_id is not None and work.seq_id is not None:
                seq = self._sequences.get(work.model_id)
                if seq is None:
                    raise ApiError(404, f'model {work.model_id!r} is not loaded')
                if self._used(seq, work.seq_id):
                    raise ApiError(
                        400,
                        f'seq_id {work.seq_id} of model {work.model_id!r} was already used '
                        f'(next expected: {seq.next_seq})',
                    )
                seq.parked[work.seq_id] = work
                self._release(seq)
            else:
                self._enqueue(work)
            self._cond.notify()

    def skip(self, model_id: str, seq_id: int) -> None:
        """A request with this seq_id was rejected before queueing: let later requests run. A seq_id whose work
        is already queued, parked or done is left alone (the rejected request was a duplicate)."""
        with self._cond:
            seq = self._sequences.get(model_id)
            if seq is None or self._used(seq, seq_id):
                return
            seq.skipped.add(seq_id)
            self._release(seq)
            self._cond.notify()

    def queued(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._ready.values())

    def cancel(self, request_id: str, exc: BaseException) -> str | None:
        """Cancel the sample work answering `request_id`. Queued: dropped before it runs and answered with `exc`
        (neither a failure nor a success in the metrics), ``'queued'``. Running: its `cancelled` event is set, so a
        sampler that declares `stops_rows` stops its rows at the next decode step (another runs them to the end);
        the caller discards the result, ``'running'``. None when no such work is here. Each is counted in `stats`
        (``cancelled_queued_samples``, ``cancelled_running_samples``)."""
        with self._cond:
            found = None
            for q in self._ready.values():
                for work in q:
                    if work.sample is not None and work.request_id == request_id:
                        found = work
                        break
                if found is not None:
                    q.remove(found)
                    break
            if found is None:
                running = [w for w in self._running if w.sample is not None and w.request_id == request_id]
                for work in running:
                    work.cancelled.set()
                self.stats['cancelled_running_samples'] += bool(running)
                return 'running' if running else None
            self._queued_samples -= 1
            self.stats['cancelled_queued_samples'] += 1
            for t in [t for t, q in self._ready.items() if not q]:
                del self._ready[t]
        logger.info('sample request %s cancelled before it ran', request_id)
        with logs.bound(found.context):
            try:
                found.on_error(exc)
            except BaseException:  # noqa: BLE001
                logger.exception('answering a cancelled request failed')
        return 'queued'

    # ---- read-only views (metrics, drain) ------------------------------------------------------------------
    def queue_depths(self) -> dict[str, int]:
        """Accepted work not yet running, by kind (train, sample, call): ready, or parked for an earlier seq_id."""
        depths = dict.fromkeys(KINDS, 0)
        with self._cond:
            for work in self._waiting():
                depths[work.kind] += 1
        return depths

    def running(self) -> int:
        """Work items in the host call running now."""
        with self._cond:
            return len(self._running)

    def idle(self) -> bool:
        """Nothing queued, parked or running."""
        with self._cond:
            return not self._running and not any(True for _ in self._waiting())

    # ---- shutdown ------------------------------------------------------------------------------------------
    def fail_gaps(self, exc: BaseException) -> int:
        """Fail parked work that waits for a seq_id nothing will send any more (the server drains and no request
        is in flight); returns how many."""
        with self._cond:
            failed = []
            for seq in self._sequences.values():
                if seq.parked and not seq.running:
                    failed += [seq.parked[s] for s in sorted(seq.parked)]
                    seq.parked.clear()
                    seq.blocked_since = None
        for work in failed:
            self._fail(work, exc)
        return len(failed)

    def abandon(self, exc: BaseException, refusal: str) -> int:
        """Fail all queued and parked work with `exc`, and refuse (503 `refusal`) whatever is submitted later.
        The host call running now is not interrupted. Returns how many were failed."""
        with self._cond:
            self._refusal = refusal
            failed = list(self._waiting())
            self._ready.clear()
            for seq in self._sequences.values():
                seq.parked.clear()
                seq.blocked_since = None
            self._queued_samples = 0
        for work in failed:
            self._fail(work, exc)
        return len(failed)

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the worker thread once its current host call returns (waiting at most `timeout_s`)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=timeout_s)

    # ---- internals (lock held) -----------------------------------------------------------------------------
    def _waiting(self) -> Iterator[Work]:
        for q in self._ready.values():
            yield from q
        for seq in self._sequences.values():
            yield from seq.parked.values()

    def _enqueue(self, work: Work) -> None:
        self._ready.setdefault(work.tenant, deque()).append(work)

    @staticmethod
    def _used(seq: SeqState, seq_id: int) -> bool:
        return seq_id < seq.next_seq or seq_id in seq.parked or (seq.running and seq_id == seq.next_seq)

    def _release(self, seq: SeqState) -> None:
        """Move the parked work whose turn has come to the ready queue (one at a time: the next is released
        when it finishes), and note when parked work starts waiting for a seq_id that has not arrived."""
        if seq.running:
            return
        while seq.next_seq in seq.skipped:
            seq.skipped.discard(seq.next_seq)
            seq.next_seq += 1
        work = seq.parked.pop(seq.next_seq, None)
        if work is not None:
            seq.running, seq.blocked_since = True, None
            self._enqueue(work)
        elif not seq.parked:
            seq.blocked_since = None
        elif seq.blocked_since is None:
            seq.blocked_since = time.monotonic()

    def _expire_gaps(self) -> list[tuple[Work, ApiError]]:
        """Fail parked work that waited `seq_gap_timeout_s` for a missing seq_id; move the sequence past it."""
        now, failed = time.monotonic(), []
        for model_id, seq in self._sequences.items():
            if seq.blocked_since is None or now - seq.blocked_since < self.seq_gap_timeout_s:
                continue
            waiting = sorted(seq.parked)
            missing = [s for s in range(seq.next_seq, waiting[-1]) if s not in seq.parked]
            err = ApiError(
                408,
                f'model {model_id!r}: seq_id {missing[0] if len(missing) == 1 else missing} never '
                f'arrived within {self.seq_gap_timeout_s:.0f} s (refused, lost or never sent), so '
                f'seq_id {waiting} did not run; send the next request with seq_id '
                f'{waiting[-1] + 1}',
                category='user',
            )
            failed += [(seq.parked[s], err) for s in waiting]
            seq.parked.clear()
            seq.next_seq = waiting[-1] + 1
            seq.skipped = {s for s in seq.skipped if s >= seq.next_seq}
            seq.blocked_since = None
            self._release(seq)
        return failed

    def _next_gap_deadline(self) -> float | None:
        times = [s.blocked_since for s in self._sequences.values() if s.blocked_since is not None]
        return None if not times else max(0.0, min(times) + self.seq_gap_timeout_s - time.monotonic())

    def _finished(self, work: Work) -> None:
        with self._cond:
            if work.sample is not None:
                self._queued_samples -= 1
            if work.model_id is not None and work.seq_id is not None:
                seq = self._sequences.get(work.model_id)
                if seq is not None and seq.next_seq == work.seq_id:
                    seq.next_seq += 1
                    seq.running = False
                    self._release(seq)
            self._cond.notify()

    def _take(self) -> list[Work]:
        """Next work in tenant rotation, plus compatible work queued behind it: for a forward/backward, the
        heads of other tenants' queues that are forward/backward passes of other adapters (one mixed pass);
        for a sample, queued sample jobs of every tenant (one sampler batch), up to `max_batch`."""
        tenant = next(t for t, q in self._ready.items() if q)
        first = self._ready[tenant].popleft()
        self._ready.move_to_end(tenant)
        batch = [first]
        if first.train is not None:
            adapters = {first.train.adapter}
            for q in self._ready.values():
                if len(batch) >= self.max_batch:
                    break
                if q and q[0].train is not None and q[0].train.adapter not in adapters:
                    adapters.add(q[0].train.adapter)
                    batch.append(q.popleft())
        elif first.sample is not None:
            for q in self._ready.values():
                while q and q[0].sample is not None and len(batch) < self.max_batch:
                    batch.append(q.popleft())
        for t in [t for t, q in self._ready.items() if not q]:
            del self._ready[t]
        return batch

    # ---- the worker thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stop:
                        return
                    expired = self._expire_gaps()
                    if expired or any(self._ready.values()):
                        break
                    self._cond.wait(timeout=self._next_gap_deadline())
                batch = self._take() if any(self._ready.values()) else []
                self._running = batch
            for work, err in expired:
                self._fail(work, err)
            if batch:
                self._run(batch)

    def _fail(self, work: Work, exc: BaseException, counted: bool = False) -> None:
        """Report a failed work item: the `twinkle_failure` hook, then its request's future (and, unless its host
        call already `counted` it, the failure metric)."""
        with logs.bound(work.context):
            if not counted:
                self.metrics.work_failed(self.host.base_model, work.operation)
            emit_failure(
                exc,
                {
                    'where': 'server',
                    'base_model': self.host.base_model,
                    'tenant': work.tenant,
                    'model_id': work.model_id,
                    'seq_id': work.seq_id,
                    'kind': work.kind,
                },
            )
            try:
                work.on_error(exc)
            except BaseException:  # noqa: BLE001
                logger.exception('failing a request failed')

    def _run(self, batch: list[Work]) -> None:
        op = 'forward' if all(w.operation == 'forward' for w in batch) else batch[0].operation
        start = time.perf_counter()
        with logs.bound(logs.merged([w.context for w in batch])):
            if batch[0].train is not None:
                self._count(len(batch))
            elif batch[0].sample is not None:
                self.stats['sample_passes'] += 1
            results = host_call(self.host, batch)
            seconds = time.perf_counter() - start
            tokens = tokens_of(batch, results)
            logger.info('engine %s: %d request(s), %d token(s), %.3f s', op, len(batch), sum(tokens.values()), seconds)
        failed = 0
        for work, result in zip(batch, results):
            with logs.bound(work.context):
                try:
                    if isinstance(result, BaseException):
                        failed += 1
                        self._fail(work, result, counted=True)
                    else:
                        work.on_done(result)
                except BaseException as exc:  # noqa: BLE001 - a failing callback fails only its own request
                    logger.exception('completing a request failed')
                    failed += 1
                    self._fail(work, exc, counted=True)
                finally:
                    self._finished(work)
        with self._cond:
            self._running = []
        self.metrics.host_call(
            self.host.base_model, op, seconds, done=len(batch) - failed, failed=failed, tokens=tokens
        )

    def _count(self, adapters: int) -> None:
        self.stats['train_passes'] += 1
        self.stats['mixed_train_passes'] += adapters > 1
        self.stats['max_adapters_per_pass'] = max(self.stats['max_adapters_per_pass'], adapters)
