"""PostgreSQL backend through psycopg 3 (``pip install "twinkle-server[postgres]"``).

A small pool of autocommit connections: a thread takes one for a statement (or a transaction) and gives it
back; at most `pool_size` are open, more callers wait. A connection the server broke (restart, network) is
dropped when it is given back, so the next caller connects afresh; the statement that met the break fails.
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from typing import Any, Iterator

from twinkle_server.store.db.base import Database, DatabaseError, Session
from twinkle_server.store.db.url import mask_url

#: pg_advisory_xact_lock key serializing migrations of one database across server processes
MIGRATION_LOCK = zlib.crc32(b'twinkle_server.schema_migrations')
CONNECT_TIMEOUT_S = 10


def translate(sql: str) -> str:
    """`?` placeholders -> psycopg's `%s` (a literal `%` is doubled). The store's SQL has no `?` or `%` inside
    string literals."""
    return sql.replace('%', '%%').replace('?', '%s')


class PostgresDatabase(Database):
    dialect = 'postgresql'
    types = {'INT': 'BIGINT', 'REAL': 'DOUBLE PRECISION', 'BLOB': 'BYTEA'}

    def __init__(self, url: str, pool_size: int = 8) -> None:
        self.url = mask_url(url)
        self._dsn = url
        try:
            import psycopg
        except ImportError as exc:
            raise DatabaseError(
                f'{self.url}: PostgreSQL needs the psycopg driver ({exc}); pip install "twinkle-server[postgres]"'
            ) from exc
        try:
            self._password = psycopg.conninfo.conninfo_to_dict(url).get('password')
        except psycopg.Error as exc:
            raise DatabaseError(f'invalid database URL {self.url}: {exc}') from None
        self._psycopg = psycopg
        self._size = pool_size
        self._idle: list[Any] = []
        self._open = 0
        self._cond = threading.Condition()
        self._closed = False
        self._give_back(self._take())  # fail now, at start, when the server cannot be reached

    # ---- pool ----------------------------------------------------------------------------------------------
    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(
                self._dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, application_name='twinkle-server'
            )
        except self._psycopg.Error as exc:
            reason = str(exc).strip()
            if self._password:
                reason = reason.replace(str(self._password), '***')
            raise DatabaseError(f'cannot connect to the metadata database {self.url}: {reason}') from None

    def _take(self) -> Any:
        with self._cond:
            while True:
                if self._closed:
                    raise DatabaseError(f'the metadata database {self.url} is closed')
                if self._idle:
                    return self._idle.pop()
                if self._open < self._size:
                    self._open += 1
                    break
                self._cond.wait()
        try:
            return self._connect()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _give_back(self, conn: Any) -> None:
        idle = self._psycopg.pq.TransactionStatus.IDLE
        healthy = not conn.closed and not conn.broken and conn.info.transaction_status == idle
        with self._cond:
            if healthy and not self._closed:
                self._idle.append(conn)
            else:
                self._open -= 1
                conn.close()
            self._cond.notify()

    # ---- Database ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        conn = self._take()
        try:
            yield Session(conn, translate)
        finally:
            self._give_back(conn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        with self.session() as s, s.conn.transaction():
            yield s

    def lock_for_migrations(self, s: Session) -> None:
        s.execute('SELECT pg_advisory_xact_lock(?)', (MIGRATION_LOCK,))

    def has_table(self, s: Session, name: str) -> bool:
        return (
            s.one(
                'SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?',
                (name,),
            )
            is not None
        )

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            conn.close()
