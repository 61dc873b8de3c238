"""The metadata database behind `twinkle_server.store.Store`: SQLite (default) or PostgreSQL.

    open_database(None, data_dir)                      # SQLite file <data_dir>/server.db
    open_database('sqlite:////srv/twinkle/meta.db', d) # SQLite file elsewhere (SQLAlchemy-style URL)
    open_database('postgresql://user:pw@host/db', d)   # PostgreSQL through psycopg 3

Both backends run the same SQL (written with `?` placeholders; `Database` translates) and are migrated to the
same schema by `migrations.migrate`. Errors opening a database raise `DatabaseError` naming the URL with its
password masked.
"""

from __future__ import annotations

from pathlib import Path

from twinkle_server.store.db.base import Database, DatabaseError, Session
from twinkle_server.store.db.postgres import PostgresDatabase
from twinkle_server.store.db.sqlite import SqliteDatabase
from twinkle_server.store.db.url import mask_url, parse_url

__all__ = ['Database', 'DatabaseError', 'Session', 'mask_url', 'open_database']

SQLITE_FILE = 'server.db'


def open_database(database_url: str | None, data_dir: str | Path) -> Database:
    """Connect to `database_url` (None or '': SQLite in `data_dir`). Raises `DatabaseError` for a malformed or
    unsupported URL, a missing driver or an unreachable server."""
    kind, target = parse_url(database_url)
    if kind == 'sqlite':
        return SqliteDatabase(Path(target) if target else Path(data_dir) / SQLITE_FILE)
    return PostgresDatabase(target)
