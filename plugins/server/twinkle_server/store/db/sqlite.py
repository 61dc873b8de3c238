"""SQLite backend: one file (WAL mode), one connection shared by every thread behind one lock.

The file and its -wal/-shm siblings are created mode 0600 (they hold API key digests) in a 0700 directory.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Iterator

from twinkle_server.store.db.base import Database, DatabaseError, Session

MEMORY = ':memory:'
#: how long opening the database waits for another connection's lock (another front starting or migrating)
BUSY_TIMEOUT_S = 30.0


class SqliteDatabase(Database):
    dialect = 'sqlite'
    types = {'INT': 'INTEGER', 'REAL': 'REAL', 'BLOB': 'BLOB'}

    def __init__(self, path: str | Path) -> None:
        self.memory = str(path) == MEMORY
        self.path = Path(path)
        self.url = f'sqlite:///{MEMORY if self.memory else self.path.resolve()}'
        try:
            if not self.memory:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))  # created private, never world-readable
            # Another front opening or migrating the same file holds its lock: wait for it (the busy timeout is set
            # by connect, before the first statement; sqlite3's default of 5 s is too short under load).
            db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S)
            _switch_to_wal(db)
            db.execute('PRAGMA synchronous=NORMAL')
        except (OSError, sqlite3.Error) as exc:
            raise DatabaseError(f'cannot open the metadata database {self.url}: {exc}') from exc
        self._lock = threading.RLock()
        self._session = Session(db)
        self._make_private()

    def _make_private(self) -> None:
        """sqlite creates -wal/-shm with the database's mode; enforce 0600 on all three (older files too)."""
        for suffix in ('', '-wal', '-shm') if not self.memory else ():
            f = Path(f'{self.path}{suffix}')
            if f.exists():
                os.chmod(f, 0o600)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        with self._lock:
            yield self._session

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        with self._lock:
            s = self._session
            s.execute('BEGIN IMMEDIATE')
            try:
                yield s
                s.execute('COMMIT')
            except BaseException:
                if s.conn.in_transaction:  # also when COMMIT itself failed (e.g. a full disk)
                    s.execute('ROLLBACK')
                raise

    def has_table(self, s: Session, name: str) -> bool:
        return s.one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)) is not None

    def close(self) -> None:
        with self._lock:
            self._session.conn.close()


def _switch_to_wal(db: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode=WAL``, retried for up to `BUSY_TIMEOUT_S`: the switch needs an exclusive lock, and
    where waiting for it could deadlock with another connection's read lock SQLite answers "database is locked" at
    once instead of calling the busy handler -- fronts opening one file together hit that."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    delay = 0.01
    while True:
        try:
            db.execute('PRAGMA journal_mode=WAL')
            return
        except sqlite3.OperationalError as exc:
            if ('locked' not in str(exc) and 'busy' not in str(exc)) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
