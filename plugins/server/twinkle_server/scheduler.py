"""One worker thread per base model: seq_id ordering per training model, fair round-robin across tenants,
and batching of compatible work (forward/backward passes of different adapters; samples) into one engine call.

- A training model's requests carry `seq_id` 1, 2, 3...; they may arrive out of order (the SDK posts chunks
  concurrently). Work with seq_id `n` is parked until `n - 1` has finished, so each model runs strictly in order.
- Ready work waits in one queue per tenant; the worker serves tenants in rotation, so one tenant's long queue
  never starves another.
- When the picked work is a forward/backward, the heads of the other tenants' queues that are also
  forward/backward passes (of other adapters) join the same engine call: one mixed-tenant pass.
  Sample jobs are batched the same way.
- All torch work happens on this thread; the event loop only enqueues.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from twinkle_server.engine.base import Engine, SampleJob, TrainBatch
from twinkle_server.errors import ApiError

logger = logging.getLogger(__name__)

Done = Callable[[Any], None]
Failed = Callable[[BaseException], None]


@dataclass
class Work:
    """A unit of engine work. Exactly one of `train`, `sample`, `call` is set."""
    tenant: str
    on_done: Done
    on_error: Failed
    train: TrainBatch | None = None
    sample: SampleJob | None = None
    call: Callable[[Engine], Any] | None = None
    model_id: str | None = None  # set (with seq_id) for a training model's ordered requests
    seq_id: int | None = None


@dataclass
class _Sequence:
    next_seq: int = 1
    parked: dict[int, Work] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)


class ModelWorker:
    """Executes one engine's work queue on a dedicated thread."""

    def __init__(self, engine: Engine, *, max_queued_samples: int = 256, max_batch: int = 16) -> None:
        self.engine = engine
        self.max_queued_samples = max_queued_samples
        self.max_batch = max_batch
        self._ready: OrderedDict[str, deque[Work]] = OrderedDict()
        self._sequences: dict[str, _Sequence] = {}
        self._queued_samples = 0
        #: counters for monitoring (and tests): engine passes, and how many of them mixed several adapters
        self.stats = {'train_passes': 0, 'mixed_train_passes': 0, 'max_adapters_per_pass': 0, 'sample_passes': 0}
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name=f'twinkle-worker[{engine.base_model}]', daemon=True)
        self._thread.start()

    # ---- submission (event loop) ---------------------------------------------------------------------------
    def start_sequence(self, model_id: str, next_seq: int = 1) -> None:
        with self._cond:
            self._sequences[model_id] = _Sequence(next_seq)

    def end_sequence(self, model_id: str) -> None:
        with self._cond:
            seq = self._sequences.pop(model_id, None)
        for work in (seq.parked.values() if seq else ()):
            work.on_error(ApiError(404, f'model {model_id!r} was unloaded before this request ran'))

    def submit(self, work: Work) -> None:
        """Queue `work`; raises ApiError 429 when the sample queue is full, 400 for a used seq_id."""
        with self._cond:
            if work.sample is not None:
                if self._queued_samples >= self.max_queued_samples:
                    raise ApiError(429, f'sampling queue of {self.engine.base_model!r} is full '
                                        f'({self.max_queued_samples} requests); retry shortly')
                self._queued_samples += 1
            if work.model_id is not None and work.seq_id is not None:
                seq = self._sequences.get(work.model_id)
                if seq is None:
                    raise ApiError(404, f'model {work.model_id!r} is not loaded')
                if work.seq_id < seq.next_seq or work.seq_id in seq.parked:
                    raise ApiError(400, f'seq_id {work.seq_id} of model {work.model_id!r} was already used '
                                        f'(next expected: {seq.next_seq})')
                seq.parked[work.seq_id] = work
                self._release(seq)
            else:
                self._enqueue(work)
            self._cond.notify()

    def skip(self, model_id: str, seq_id: int) -> None:
        """A request with this seq_id was rejected before queueing: let later requests run."""
        with self._cond:
            seq = self._sequences.get(model_id)
            if seq is None or seq_id < seq.next_seq:
                return
            seq.skipped.add(seq_id)
            self._release(seq)
            self._cond.notify()

    def queued(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._ready.values())

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=10)

    # ---- internals (lock held) -----------------------------------------------------------------------------
    def _enqueue(self, work: Work) -> None:
        self._ready.setdefault(work.tenant, deque()).append(work)

    def _release(self, seq: _Sequence) -> None:
        """Move the parked work whose turn has come to the ready queue (one at a time: the next is released
        when it finishes)."""
        while seq.next_seq in seq.skipped:
            seq.skipped.discard(seq.next_seq)
            seq.next_seq += 1
        work = seq.parked.pop(seq.next_seq, None)
        if work is not None:
            self._enqueue(work)

    def _finished(self, work: Work) -> None:
        with self._cond:
            if work.sample is not None:
                self._queued_samples -= 1
            if work.model_id is not None and work.seq_id is not None:
                seq = self._sequences.get(work.model_id)
                if seq is not None and seq.next_seq == work.seq_id:
                    seq.next_seq += 1
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
                while not self._stop and not any(self._ready.values()):
                    self._cond.wait()
                if self._stop:
                    return
                batch = self._take()
            self._run(batch)

    def _run(self, batch: list[Work]) -> None:
        try:
            if batch[0].train is not None:
                self._count(len(batch))
                results = self.engine.forward_backward([w.train for w in batch])  # type: ignore[misc]
            elif batch[0].sample is not None:
                self.stats['sample_passes'] += 1
                results = self.engine.sample([w.sample for w in batch])  # type: ignore[misc]
            else:
                results = [_call(batch[0].call, self.engine)]  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - the worker must survive anything
            logger.exception('engine call failed')
            results = [exc] * len(batch)
        for work, result in zip(batch, results):
            try:
                if isinstance(result, BaseException):
                    work.on_error(result)
                else:
                    work.on_done(result)
            except BaseException as exc:  # noqa: BLE001 - a failing callback fails only its own request
                logger.exception('completing a request failed')
                try:
                    work.on_error(exc)
                except BaseException:  # noqa: BLE001
                    logger.exception('failing a request failed')
            finally:
                self._finished(work)


    def _count(self, adapters: int) -> None:
        self.stats['train_passes'] += 1
        self.stats['mixed_train_passes'] += adapters > 1
        self.stats['max_adapters_per_pass'] = max(self.stats['max_adapters_per_pass'], adapters)


def _call(fn: Callable[[Engine], Any], engine: Engine) -> Any:
    try:
        return fn(engine)
    except BaseException as exc:  # noqa: BLE001
        return exc
