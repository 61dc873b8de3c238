"""Futures: every queued request answers `{request_id}` at once; clients long-poll `retrieve_future`.

A future is completed from a worker thread (`resolve` / `reject`) and awaited on the event loop (`wait`).
Finished results are written to the store, so a client can still collect them after a restart; futures that
were pending when the server died are failed at start-up with a message that says to resubmit. The first answer
a future gets is final: a late one (work that finished after a drain failed it) is ignored.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from twinkle_server.errors import failure_body
from twinkle_server.store import FutureRow, Store

logger = logging.getLogger(__name__)
JSON = 'application/json'
MAX_UNSAVED = 1024
PROTOBUF = 'application/x-protobuf'


@dataclass
class _Pending:
    tenant: str
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event = field(default_factory=asyncio.Event)
    answered: bool = False  # a result is being recorded: later answers are ignored
    target: str | None = None  # the sampling-session client whose `retrieve_futures` reports it


class FutureTable:
    """Pending futures in memory, finished ones in the store."""

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop
        self._pending: dict[str, _Pending] = {}
        # results the store refused outright (its write-behind for a full disk is full too, or the database is
        # unreachable), newest last
        self._unsaved: dict[str, FutureRow] = {}
        # (tenant, target) -> events of the `retrieve_futures` polls waiting for one of its futures to finish
        self._watchers: dict[tuple[str, str], set[asyncio.Event]] = {}
        self._lock = threading.Lock()

    def recover(self) -> int:
        """Fail futures left pending by a previous process. Returns how many."""
        n = 0
        body = json.dumps(
            {'error': 'the server restarted before this request finished; submit it again', 'category': 'server'}
        ).encode()
        for request_id in self.store.pending_futures():
            self.store.finish_future(request_id, 'failed', JSON, body)
            n += 1
        return n

    def create(
        self,
        tenant: str,
        target: str | None = None,
        *,
        session_id: str | None = None,
        op: str | None = None,
        model_id: str | None = None,
    ) -> str:
        """A pending future of `tenant`; `target`: the sampling-session client whose `retrieve_futures` polls
        report it once it finishes; `session_id`, `op`, `model_id`: recorded for the session's trace."""
        request_id = f'req-{uuid.uuid4().hex}'
        self.store.add_future(request_id, tenant, target, session_id=session_id, op=op, model_id=model_id)
        with self._lock:
            self._pending[request_id] = _Pending(tenant, self.loop, target=target)
        return request_id

    def pending(self, tenant: str) -> int:
        """Requests of `tenant` queued or running now."""
        with self._lock:
            return sum(1 for p in self._pending.values() if p.tenant == tenant)

    def pending_total(self) -> int:
        """Requests of all tenants queued or running now."""
        with self._lock:
            return len(self._pending)

    def fail_pending(self, exc: BaseException) -> int:
        """Fail every unanswered future with `exc` (shutdown); returns how many."""
        with self._lock:
            ids = [rid for rid, p in self._pending.items() if not p.answered]
        for request_id in ids:
            self.reject(request_id, exc)
        return len(ids)

    # ---- completion (any thread) ---------------------------------------------------------------------------
    def resolve(self, request_id: str, result: Any) -> None:
        """`result`: a JSON-serialisable value or protobuf `bytes`."""
        if isinstance(result, (bytes, bytearray)):
            self._finish(request_id, 'done', PROTOBUF, bytes(result))
        else:
            self._finish(request_id, 'done', JSON, json.dumps(result).encode())

    def reject(self, request_id: str, exc: BaseException, *, untarget: bool = False) -> None:
        """Fail the future with `exc`; `untarget`: the client never learnt its id (its submission was refused), so
        `retrieve_futures` does not report it."""
        self._finish(request_id, 'failed', JSON, json.dumps(failure_body(exc)).encode(), untarget=untarget)

    def _finish(self, request_id: str, state: str, content_type: str, body: bytes, *, untarget: bool = False) -> None:
        with self._lock:
            claimed = self._pending.get(request_id)
            if claimed is None or claimed.answered:
                logger.debug('%s was answered already; ignoring a later %s result', request_id, state)
                return
            claimed.answered = True
        try:
            self.store.finish_future(request_id, state, content_type, body, untarget=untarget)
        except Exception:  # noqa: BLE001 - the client must still get its answer
            logger.exception('could not record the result of %s; keeping it in memory', request_id)
            with self._lock:
                pending = self._pending.get(request_id)
                if pending is not None:
                    self._unsaved[request_id] = FutureRow(request_id, pending.tenant, state, content_type, body)
                    while len(self._unsaved) > MAX_UNSAVED:
                        self._unsaved.pop(next(iter(self._unsaved)))
        with self._lock:
            pending = self._pending.pop(request_id, None)
            watchers = (
                list(self._watchers.get((pending.tenant, pending.target), ()))
                if pending is not None and pending.target is not None and not untarget
                else []
            )
        if pending is not None:
            try:
                pending.loop.call_soon_threadsafe(pending.event.set)
                for event in watchers:
                    pending.loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the event loop has closed (shutdown): nobody is waiting any more
                pass

    # ---- retrieval (event loop) ----------------------------------------------------------------------------
    async def completions(
        self, tenant: str, target: str, prev_cursor: int, timeout_s: float
    ) -> tuple[list[tuple[str, str, int | None]], int]:
        """`retrieve_futures`: the finished futures of `tenant`'s `target` not yet acknowledged by `prev_cursor`
        (`Store.deliver_completions`), waiting up to `timeout_s` for one when there are none."""
        event = asyncio.Event()
        key = (tenant, target)
        with self._lock:  # watch first, then look: a future finishing in between still wakes this poll
            self._watchers.setdefault(key, set()).add(event)
        try:
            found, cursor = self.store.deliver_completions(tenant, target, prev_cursor)
            if found or timeout_s <= 0:
                return found, cursor
            try:
                await asyncio.wait_for(event.wait(), timeout=timeout_s)
            except TimeoutError:
                return [], prev_cursor
            return self.store.deliver_completions(tenant, target, prev_cursor)
        finally:
            with self._lock:
                waiting = self._watchers.get(key)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._watchers[key]

    async def wait(self, request_id: str, tenant: str, timeout_s: float) -> FutureRow | None:
        """The finished row, a pending row after `timeout_s`, or None if the id is unknown to this tenant."""
        with self._lock:
            pending = self._pending.get(request_id)
        if pending is not None and pending.tenant == tenant:
            try:
                await asyncio.wait_for(pending.event.wait(), timeout=timeout_s)
            except TimeoutError:
                pass
        with self._lock:
            unsaved = self._unsaved.get(request_id)
        if unsaved is not None and unsaved.tenant == tenant:
            return unsaved
        return self.store.future(request_id, tenant)
