"""What both database backends provide: statements with `?` placeholders on a `Session` (one connection),
autocommitted one by one or grouped in a transaction."""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Callable, ClassVar

from twinkle_core.errors import TwinkleError

Params = tuple[Any, ...]


class DatabaseError(TwinkleError, RuntimeError):
    """The metadata database cannot be opened, reached or migrated. The message names the URL (password
    masked) and what to do."""


class Session:
    """Statements on one DB-API connection. SQL uses `?` placeholders; `translate` turns them into the
    driver's style (the only place the dialects' parameter styles differ)."""

    def __init__(self, conn: Any, translate: Callable[[str], str] = lambda sql: sql) -> None:
        self.conn = conn
        self._translate = translate

    def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; returns the number of rows it changed."""
        return self.conn.execute(self._translate(sql), params).rowcount

    def one(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        return self.conn.execute(self._translate(sql), params).fetchone()

    def all(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return list(self.conn.execute(self._translate(sql), params).fetchall())


class Database(abc.ABC):
    """A connected metadata database, safe to use from any thread.

    `dialect` is 'sqlite' or 'postgresql'; `types` maps the neutral column types used in migrations
    (``{INT}``, ``{REAL}``, ``{BLOB}``) to the dialect's; `url` is for messages (password masked).
    """

    dialect: ClassVar[str]
    types: ClassVar[dict[str, str]]
    url: str

    @abc.abstractmethod
    def session(self) -> contextlib.AbstractContextManager[Session]:
        """A connection for the caller's exclusive use; each statement commits on its own."""

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[Session]:
        """A connection inside a transaction: committed when the block ends, rolled back if it raises. On SQLite
        it holds the database's write lock from the start (so concurrent migrations serialize)."""

    @abc.abstractmethod
    def has_table(self, s: Session, name: str) -> bool:
        """Whether table `name` exists (in the current schema)."""

    def lock_for_migrations(self, s: Session) -> None:
        """Inside `transaction()`: keep other processes from migrating until it ends (default: nothing more
        than the transaction itself)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close every connection; the database is unusable afterwards."""

    # ---- one autocommitted statement ----------------------------------------------------------------------
    def execute(self, sql: str, params: Params = ()) -> int:
        with self.session() as s:
            return s.execute(sql, params)

    def one(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        with self.session() as s:
            return s.one(sql, params)

    def all(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        with self.session() as s:
            return s.all(sql, params)
