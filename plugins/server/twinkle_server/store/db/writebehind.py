"""Write-behind for a full disk: metadata writes the database refuses for lack of space wait in memory.

Every write goes through `WriteBehind.write` (or `execute`): with nothing waiting it is one transaction, as
before. When it fails because the disk is full (`errors.is_disk_full`) it is checked on top of the waiting writes
(a transaction that is rolled back: a constraint error still reaches the caller) and queued. The queue is ordered
and replayed whole, in one transaction, before the next write and every `FLUSH_EVERY_S` by a background thread,
so each write is applied exactly once, in order, when space returns. Reads (`one`, `all`, `read`) see the waiting
writes: those on the tables a read names are replayed in a transaction that is rolled back after the read.

The queue is bounded (`MAX_WAITING` writes, `MAX_WAITING_BYTES` of parameters): past that a write raises
`BacklogFull` (an `OSError` ENOSPC, answered 507). A write with a `key` (a heartbeat's timestamp) replaces the
waiting one with the same key, so repeated touches take one slot. A waiting write whose replay fails for another
reason (another process changed the database meanwhile) is dropped, with an error in the log, rather than
blocking every later write.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Hashable, TypeVar

from twinkle_server.errors import BacklogFull, is_disk_full
from twinkle_server.store.db.base import Database, Params, Session

logger = logging.getLogger(__name__)
T = TypeVar('T')
FLUSH_EVERY_S = 2.0
MAX_WAITING = 10_000
MAX_WAITING_BYTES = 256 * 1024 * 1024
_WRITTEN = re.compile(r'\b(?:INSERT\s+INTO|(?<!DO\s)UPDATE|DELETE\s+FROM)\s+(\w+)', re.IGNORECASE)
_READ = re.compile(r'\b(?:FROM|JOIN)\s+(\w+)', re.IGNORECASE)
Statement = tuple[str, Params]


@dataclass(frozen=True)
class Write:
    """One atomic metadata write: statements run in one transaction; `key`: a later write with the same key
    supersedes this one while both wait (only for writes that merely re-stamp a row)."""

    statements: tuple[Statement, ...]
    key: Hashable | None = None

    @cached_property
    def tables(self) -> frozenset[str]:
        return frozenset(t.lower() for sql, _ in self.statements for t in _WRITTEN.findall(sql))

    @cached_property
    def size(self) -> int:
        """Bytes it holds in memory, roughly (its SQL and its text and bytes parameters)."""
        return sum(
            len(sql) + sum(len(p) for p in params if isinstance(p, (str, bytes))) for sql, params in self.statements
        )

    def apply(self, s: Session) -> int:
        """Run the statements; the rows changed by the last one."""
        changed = 0
        for sql, params in self.statements:
            changed = s.execute(sql, params)
        return changed

    def describe(self) -> str:
        """Its SQL, without the parameters (they may hold key digests)."""
        return '; '.join(sql for sql, _ in self.statements)


class _Discard(Exception):
    """Raised to roll back a transaction that only served a read."""


class WriteBehind:
    """Writes and reads of `db` that survive a full disk (module docstring). `enabled=False`: writes fail as
    before (a short-lived process such as the CLI must not report a write it may never make)."""

    def __init__(
        self, db: Database, *, enabled: bool = True, limit: int = MAX_WAITING, limit_bytes: int = MAX_WAITING_BYTES
    ) -> None:
        self.db = db
        self.enabled = enabled
        self.limit = limit
        self.limit_bytes = limit_bytes
        self._waiting: dict[Hashable, Write] = {}  # insertion-ordered: the order the writes were made
        self._bytes = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

    @property
    def waiting(self) -> int:
        """Writes waiting for disk space."""
        return len(self._waiting)

    # ---- writes ----------------------------------------------------------------------------------------------
    def execute(self, sql: str, params: Params = (), key: Hashable | None = None) -> int:
        """One statement; the rows it changed (as seen on top of the waiting writes when it has to wait)."""
        return self.write(Write(((sql, params),), key))

    def write(self, w: Write) -> int:
        """Apply `w`, or queue it when the disk is full; the rows its last statement changed."""
        if not self._waiting:  # the usual case: no lock but the database's own
            try:
                return self._commit(w)
            except Exception as exc:
                if not (self.enabled and is_disk_full(exc)):
                    raise
        with self._lock:
            if self._flush():
                try:
                    return self._commit(w)
                except Exception as exc:
                    if not is_disk_full(exc):
                        raise
            return self._queue(w)

    def flush(self) -> bool:
        """Try to write what waits; True when nothing waits any more."""
        with self._lock:
            return self._flush()

    def _commit(self, w: Write) -> int:
        with self.db.transaction() as s:
            return w.apply(s)

    def _flush(self) -> bool:
        while self._waiting:
            try:
                with self.db.transaction() as s:
                    for w in self._waiting.values():
                        w.apply(s)
            except Exception as exc:
                if is_disk_full(exc):
                    return False
                self._drop_failing(exc)
                continue
            logger.warning(
                'the disk has room again: wrote the %d metadata writes that waited for it', len(self._waiting)
            )
            self._waiting.clear()
            self._bytes = 0
        return True

    def _drop_failing(self, exc: Exception) -> None:
        """Drop the first waiting write that fails on its own (on top of those before it, rolled back)."""
        for key, w in list(self._waiting.items()):
            try:
                self._scratch(w.tables, w.apply, upto=key)
            except Exception as failed:  # noqa: BLE001 - the one to drop
                if is_disk_full(failed):
                    continue
                logger.error('dropped a waiting metadata write that no longer applies (%s): %s', failed, w.describe())
                self._bytes -= self._waiting.pop(key).size
                return
        raise exc  # none of them alone: the database itself fails (e.g. unreachable)

    def _queue(self, w: Write) -> int:
        """Check `w` on top of the waiting writes, then keep it until there is room; the rows it changed."""
        replaced = self._waiting.get(w.key) if w.key is not None else None
        if replaced is None and (len(self._waiting) >= self.limit or self._bytes + w.size > self.limit_bytes):
            raise BacklogFull(len(self._waiting))
        try:
            changed = self._scratch(w.tables, w.apply)
        except Exception as exc:
            if not is_disk_full(exc):
                raise  # the write is wrong in itself (e.g. a duplicate key): the caller hears of it now
            changed = 0
        if not self._waiting:
            logger.error(
                'the disk is full: metadata writes wait in memory until space is freed (at most %d)', self.limit
            )
        key = w.key if w.key is not None else object()
        if replaced is not None:  # a re-stamp moves to the end
            self._bytes -= self._waiting.pop(key).size
        self._waiting[key] = w
        self._bytes += w.size
        self._start_flusher()
        return changed

    # ---- reads -----------------------------------------------------------------------------------------------
    def one(self, sql: str, params: Params = ()) -> tuple | None:
        return self.read(_tables_read(sql), lambda s: s.one(sql, params))

    def all(self, sql: str, params: Params = ()) -> list[tuple]:
        return self.read(_tables_read(sql), lambda s: s.all(sql, params))

    def read(self, tables: frozenset[str], fn: Callable[[Session], T]) -> T:
        """`fn(session)` as if the waiting writes to `tables` were in the database."""
        if self._waiting:
            with self._lock:
                if any(w.tables & tables for w in self._waiting.values()):
                    return self._scratch(tables, fn)
        with self.db.session() as s:
            return fn(s)

    def _scratch(self, tables: frozenset[str], fn: Callable[[Session], T], upto: Hashable | None = None) -> T:
        """`fn` in a transaction holding the waiting writes to `tables` (those before `upto`), then rolled back:
        nothing `fn` or the replay writes stays."""
        replay = []
        for key, w in self._waiting.items():
            if key is upto:
                break
            if w.tables & tables:
                replay.append(w)
        result: list[T] = []
        try:
            with self.db.transaction() as s:
                for w in replay:
                    w.apply(s)
                result.append(fn(s))
                raise _Discard
        except _Discard:
            return result[0]

    # ---- background retry ------------------------------------------------------------------------------------
    def _start_flusher(self) -> None:
        if self._flusher is None or not self._flusher.is_alive():
            self._flusher = threading.Thread(target=self._flush_until_empty, name='metadata-write-behind', daemon=True)
            self._flusher.start()

    def _flush_until_empty(self) -> None:
        while not self._stop.wait(FLUSH_EVERY_S):
            try:
                if self.flush():
                    return
            except Exception:  # noqa: BLE001 - keep retrying: the writes must not be lost
                logger.exception('writing the waiting metadata failed; retrying in %.0f s', FLUSH_EVERY_S)

    def close(self) -> None:
        """Stop retrying in the background, after a last try; what still waits is lost (logged)."""
        self._stop.set()
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - closing must go on
            logger.exception('the last write of the waiting metadata failed')
        if self._waiting:
            logger.error(
                'closing with %d metadata writes still waiting for disk space: they are lost', len(self._waiting)
            )


def _tables_read(sql: str) -> frozenset[str]:
    return frozenset(t.lower() for t in _READ.findall(sql))
