"""What the table mixins of the metadata store (`store.Store`) share: the attributes they work through, and the
upsert statement several of them write with."""

from __future__ import annotations

from twinkle_server.store.db.writebehind import WriteBehind

__all__ = ['StoreTables', 'upsert']


class StoreTables:
    """The base of every table mixin: `meta` is the (write-behind) database every read and write goes through;
    `owner` is this server's name among several sharing one PostgreSQL database (None on SQLite). `Store.__init__`
    sets both."""

    meta: WriteBehind
    owner: str | None


def upsert(table: str, columns: str, key: str) -> str:
    """INSERT of every column that replaces the row with the same `key` (SQLite >= 3.24 and PostgreSQL)."""
    names = [c.strip() for c in columns.split(',')]
    keys = {k.strip() for k in key.split(',')}
    updates = ', '.join(f'{c} = excluded.{c}' for c in names if c not in keys)
    return (
        f'INSERT INTO {table} ({columns}) VALUES ({", ".join("?" * len(names))}) '
        f'ON CONFLICT ({key}) DO UPDATE SET {updates}'
    )
