"""The metadata store: API keys, sessions, training runs, checkpoints, sampling sessions, finished futures,
checkpoint hub pushes and per-step run metrics.

`Store.open(database_url, data_dir)` picks the database (`twinkle_server.store.db`): SQLite by default (one file,
`<data_dir>/server.db`, WAL mode, mode 0600 with its -wal/-shm files: it holds the API key digests), or
PostgreSQL for a `postgresql://` URL (several server fronts may share one). Either is migrated to the newest
schema when opened (`db/migrations.py`). Every method is safe to call from any thread; the metadata traffic is
tiny next to the tensor work. With `write_behind=True` (the server) a write the database refuses for lack of
disk space waits in memory and is written when space returns, and reads see it (`db/writebehind.py`). Every read
that returns tenant-owned data takes the tenant and answers `None` for another tenant's id, so routes can turn it
into a 404 without ever revealing that the id exists. Checkpoint *files* live beside it (`checkpoint_files.py`); the
rows here only describe them.

Layout: `Store` (this package's `__init__`) opens, migrates and closes the database; its table methods come from one
mixin per group of tables, each in its own module and each working only through the `meta` / `owner` attributes
`Store` sets (`tables.StoreTables`): `keys.ApiKeyTables` (API keys), `sessions.SessionTables` (sessions),
`models.ModelTables` (training runs, sampling sessions), `checkpoints.CheckpointTables` (checkpoints, hub pushes),
`futures.FutureTables` (futures), `settings.SettingTables` (server settings, idempotent results),
`metrics.RunMetricTables` (per-step metrics of training runs) and `rollouts.RolloutTables` (rollout sessions on
/v1 and their calls). The mixins do not call one another; a `Store` method is found in the mixin named for its
table. The row types are in `rows` and are importable from here, as is
`DatabaseError`.
"""

from __future__ import annotations

from pathlib import Path

from twinkle_server.store.checkpoints import CheckpointTables
from twinkle_server.store.db import Database, DatabaseError, open_database
from twinkle_server.store.db.migrations import migrate
from twinkle_server.store.db.writebehind import WriteBehind
from twinkle_server.store.futures import FutureTables
from twinkle_server.store.keys import ApiKeyTables
from twinkle_server.store.metrics import RunMetricTables
from twinkle_server.store.models import ModelTables
from twinkle_server.store.rollouts import RolloutTables
from twinkle_server.store.rows import (
    CheckpointRow,
    FutureRow,
    PushRow,
    RequestRow,
    RolloutRow,
    SamplingSessionRow,
    SessionRow,
    TrainingRunRow,
)
from twinkle_server.store.sessions import SessionTables
from twinkle_server.store.settings import SettingTables

__all__ = [
    'CheckpointRow',
    'DatabaseError',
    'FutureRow',
    'PushRow',
    'RequestRow',
    'RolloutRow',
    'SamplingSessionRow',
    'SessionRow',
    'Store',
    'TrainingRunRow',
]


class Store(
    ApiKeyTables,
    SessionTables,
    ModelTables,
    CheckpointTables,
    FutureTables,
    SettingTables,
    RunMetricTables,
    RolloutTables,
):
    """Thread-safe access to the metadata database. `Store(data_dir)` is the SQLite file in `data_dir`;
    `Store.open(url, data_dir)` follows a configured database URL."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        database: Database | None = None,
        owner: str | None = None,
        write_behind: bool = False,
    ) -> None:
        """`owner`: this server's name among several sharing one PostgreSQL database (e.g. ``host:port``),
        recorded with each future so that `pending_futures` (start-up recovery) sees only its own and unowned
        ones. Ignored on SQLite: one server per file. `write_behind`: keep writes refused for lack of disk space
        in memory until there is room (a long-running server; never a CLI that reports what it wrote)."""
        if database is None:
            if data_dir is None:
                raise TypeError('Store needs a data_dir or an open database')
            database = open_database(None, data_dir)
        self.db = database
        self.owner = owner if database.dialect != 'sqlite' else None
        try:
            self.migrated = migrate(database)  # the versions applied by this open (empty: it was up to date)
        except BaseException:
            database.close()
            raise
        self.meta = WriteBehind(database, enabled=write_behind)  # every read and write of the table mixins

    @classmethod
    def open(
        cls, database_url: str | None, data_dir: str | Path, owner: str | None = None, write_behind: bool = False
    ) -> Store:
        """The store at `database_url` (None: SQLite in `data_dir`; ``sqlite:///PATH``; ``postgresql://...``),
        migrated. Raises `DatabaseError` (URL shown with its password masked) when it cannot be opened."""
        return cls(database=open_database(database_url, data_dir), owner=owner, write_behind=write_behind)

    @property
    def url(self) -> str:
        """The database's URL, password masked."""
        return self.db.url

    def flush(self) -> bool:
        """Write what waits for disk space now; True when nothing waits any more."""
        return self.meta.flush()

    def close(self) -> None:
        self.meta.close()
        self.db.close()
