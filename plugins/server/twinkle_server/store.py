"""The metadata store: API keys, sessions, training runs, checkpoints, sampling sessions, finished futures and
checkpoint hub pushes.

`Store.open(database_url, data_dir)` picks the database (`twinkle_server.db`): SQLite by default (one file,
`<data_dir>/server.db`, WAL mode, mode 0600 with its -wal/-shm files: it holds the API key digests), or
PostgreSQL for a `postgresql://` URL (several server fronts may share one). Either is migrated to the newest
schema when opened (`db/migrations.py`). Every method is safe to call from any thread; the metadata traffic is
tiny next to the tensor work. With `write_behind=True` (the server) a write the database refuses for lack of
disk space waits in memory and is written when space returns, and reads see it (`db/writebehind.py`). Every read
that returns tenant-owned data takes the tenant and answers `None` for another tenant's id, so routes can turn it
into a 404 without ever revealing that the id exists. Checkpoint *files* live beside it (see `checkpoints.py`); the
rows here only describe them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from twinkle_server.db import Database, DatabaseError, open_database
from twinkle_server.db.migrations import migrate
from twinkle_server.db.writebehind import Write, WriteBehind

__all__ = [
    'CheckpointRow',
    'DatabaseError',
    'FutureRow',
    'PushRow',
    'RequestRow',
    'SamplingSessionRow',
    'SessionRow',
    'Store',
    'TrainingRunRow',
]


@dataclass(frozen=True)
class TrainingRunRow:
    run_id: str
    tenant: str
    session_id: str
    base_model: str
    lora_config: dict[str, Any]
    user_metadata: dict[str, Any] | None
    created_at: float
    last_request_time: float
    corrupted: bool


@dataclass(frozen=True)
class CheckpointRow:
    run_id: str
    checkpoint_id: str  # "weights/<name>" or "sampler_weights/<name>"
    tenant: str
    kind: str  # "training" | "sampler"
    directory: str
    size_bytes: int | None
    created_at: float
    user_metadata: dict[str, str] | None
    expires_at: float | None
    listed: bool = True  # False: a snapshot made for a sampling session (unnamed save), hidden from listings
    public: bool = False  # published: readable (loaded, sampled, copied, downloaded) by every tenant


@dataclass(frozen=True)
class SessionRow:
    """A client session. `finish_reason`: the client's reason for finishing it (`success`, `errored`,
    `interrupted`; the first one reported stays), None while it runs or when none was given."""

    session_id: str
    tenant: str
    created_at: float
    last_seen: float
    finished: bool
    tags: list[str]
    user_metadata: Any
    project_id: str | None
    display_name: str | None
    finish_reason: str | None
    finish_detail: str | None


@dataclass(frozen=True)
class SamplingSessionRow:
    sampling_session_id: str
    tenant: str
    session_id: str | None
    base_model: str
    model_path: str | None
    created_at: float


@dataclass(frozen=True)
class FutureRow:
    request_id: str
    tenant: str
    state: str  # "pending" | "done" | "failed"
    content_type: str | None
    body: bytes | None
    target: str | None = None  # the sampling session (and client) whose `retrieve_futures` reports it


@dataclass(frozen=True)
class RequestRow:
    """A future as a session's trace shows it: what it did (`op`), for which model or sampling-session client
    (`model_id`, `target`), how it ended (`state`, `error` of a failed one) and when."""

    request_id: str
    op: str | None
    model_id: str | None
    target: str | None
    state: str
    created_at: float
    finished_at: float | None
    error: bytes | None


@dataclass(frozen=True)
class PushRow:
    """The hub push of one checkpoint: `repo` (``hf://org/name``), where in it (`path_in_repo`), and how it
    went (`state` 'pending' | 'pushed' | 'failed', `error` of a failed one)."""

    run_id: str
    checkpoint_id: str
    tenant: str
    repo: str
    path_in_repo: str
    private: bool
    state: str
    requested_at: float
    pushed_at: float | None = None
    error: str | None = None


_RUN = 'run_id, tenant, session_id, base_model, lora_config, user_metadata, created_at, last_request_time, corrupted'
_CKPT = (
    'run_id, checkpoint_id, tenant, kind, directory, size_bytes, created_at, user_metadata, expires_at, listed, public'
)
_SESSION = (
    'session_id, tenant, created_at, last_seen, finished, tags, user_metadata, project_id, display_name, '
    'finish_reason, finish_detail'
)
#: a checkpoint row that has not expired (its expiry compared with the parameter `now`)
_LIVE = '(expires_at IS NULL OR expires_at > ?)'
_SAMPLING = 'sampling_session_id, tenant, session_id, base_model, model_path, created_at'
_PUSH = 'run_id, checkpoint_id, tenant, repo, path_in_repo, private, state, requested_at, pushed_at, error'


def _upsert(table: str, columns: str, key: str) -> str:
    """INSERT of every column that replaces the row with the same `key` (SQLite >= 3.24 and PostgreSQL)."""
    names = [c.strip() for c in columns.split(',')]
    keys = {k.strip() for k in key.split(',')}
    updates = ', '.join(f'{c} = excluded.{c}' for c in names if c not in keys)
    return (
        f'INSERT INTO {table} ({columns}) VALUES ({", ".join("?" * len(names))}) '
        f'ON CONFLICT ({key}) DO UPDATE SET {updates}'
    )


class Store:
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
        self.meta = WriteBehind(database, enabled=write_behind)  # every read and write of the rows below

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

    # ---- API keys ------------------------------------------------------------------------------------------
    def add_api_key(self, key_id: str, tenant: str, salt: bytes, digest: bytes) -> None:
        self.meta.execute(
            'INSERT INTO api_keys (key_id, tenant, salt, digest, created_at, revoked) VALUES (?, ?, ?, ?, ?, 0)',
            (key_id, tenant, salt, digest, time.time()),
        )

    def api_key(self, key_id: str) -> tuple[str, bytes, bytes] | None:
        """(tenant, salt, digest) of an active key."""
        row = self.meta.one('SELECT tenant, salt, digest FROM api_keys WHERE key_id = ? AND revoked = 0', (key_id,))
        return (row[0], bytes(row[1]), bytes(row[2])) if row else None

    def revoke_api_keys(self, tenant: str) -> int:
        return self.meta.execute('UPDATE api_keys SET revoked = 1 WHERE tenant = ?', (tenant,))

    def tenants(self) -> list[str]:
        return [r[0] for r in self.meta.all('SELECT DISTINCT tenant FROM api_keys WHERE revoked = 0 ORDER BY tenant')]

    # ---- sessions ------------------------------------------------------------------------------------------
    def add_session(
        self,
        session_id: str,
        tenant: str,
        tags: list[str],
        user_metadata: Any,
        project_id: str | None = None,
        display_name: str | None = None,
        finish_reason: str | None = None,
        finish_detail: str | None = None,
    ) -> None:
        """A new session; one created already finished when `finish_reason` is given (e.g. for a copy)."""
        now = time.time()
        self.meta.execute(
            f'INSERT INTO sessions ({_SESSION}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
            (
                session_id,
                tenant,
                now,
                now,
                int(finish_reason is not None),
                json.dumps(tags),
                json.dumps(user_metadata),
                project_id,
                display_name,
                finish_reason,
                finish_detail,
            ),
        )

    def session(self, session_id: str, tenant: str) -> SessionRow | None:
        row = self.meta.one(
            f'SELECT {_SESSION} FROM sessions WHERE session_id = ? AND tenant = ?', (session_id, tenant)
        )
        return _session(row) if row else None

    def sessions(self, tenant: str) -> list[SessionRow]:
        """Every session of `tenant`, newest first."""
        rows = self.meta.all(
            f'SELECT {_SESSION} FROM sessions WHERE tenant = ? ORDER BY created_at DESC, session_id DESC', (tenant,)
        )
        return [_session(r) for r in rows]

    def session_ids(self, tenant: str, limit: int, offset: int) -> list[str]:
        """A page of `tenant`'s session ids, newest first."""
        rows = self.meta.all(
            'SELECT session_id FROM sessions WHERE tenant = ? ORDER BY created_at DESC, session_id DESC '
            'LIMIT ? OFFSET ?',
            (tenant, limit, offset),
        )
        return [r[0] for r in rows]

    def session_members(self, session_id: str, tenant: str) -> tuple[list[str], list[str]]:
        """(training run ids, sampling session ids) created in `tenant`'s session, oldest first."""
        runs = self.meta.all(
            'SELECT run_id FROM training_runs WHERE session_id = ? AND tenant = ? ORDER BY created_at, run_id',
            (session_id, tenant),
        )
        samplers = self.meta.all(
            'SELECT sampling_session_id FROM sampling_sessions WHERE session_id = ? AND tenant = ? '
            'ORDER BY created_at, sampling_session_id',
            (session_id, tenant),
        )
        return [r[0] for r in runs], [r[0] for r in samplers]

    def session_checkpoint_stats(self, tenant: str) -> dict[str, tuple[int, int]]:
        """session id -> (listed live checkpoints of its training runs, their bytes), for `tenant`'s sessions."""
        rows = self.meta.all(
            'SELECT r.session_id, COUNT(*), SUM(c.size_bytes) FROM checkpoints c '
            'JOIN training_runs r ON r.run_id = c.run_id '
            'WHERE c.tenant = ? AND c.listed = 1 AND (c.expires_at IS NULL OR c.expires_at > ?) '
            'GROUP BY r.session_id',
            (tenant, time.time()),
        )
        return {r[0]: (int(r[1]), int(r[2] or 0)) for r in rows}

    def session_state(self, session_id: str, tenant: str) -> str | None:
        """'active', 'finished', or None when the session is unknown to this tenant."""
        row = self.meta.one('SELECT finished FROM sessions WHERE session_id = ? AND tenant = ?', (session_id, tenant))
        return None if row is None else ('finished' if row[0] else 'active')

    def touch_session(self, session_id: str) -> None:
        self.meta.execute(
            'UPDATE sessions SET last_seen = ? WHERE session_id = ?',
            (time.time(), session_id),
            key=('last_seen', session_id),
        )

    def session_last_seen(self, session_id: str) -> float | None:
        """Last heartbeat time of an active session; None when finished or unknown."""
        row = self.meta.one('SELECT last_seen FROM sessions WHERE session_id = ? AND finished = 0', (session_id,))
        return float(row[0]) if row else None

    def count_live_sessions(self, tenant: str, seen_since: float) -> int:
        """Unfinished sessions of `tenant` that heart-beat after `seen_since`."""
        row = self.meta.one(
            'SELECT COUNT(*) FROM sessions WHERE tenant = ? AND finished = 0 AND last_seen >= ?', (tenant, seen_since)
        )
        return int(row[0]) if row else 0

    def set_session_project(self, session_id: str, tenant: str, project_id: str) -> None:
        """Move `tenant`'s session into `project_id` (its runs and samplers follow: they are found by session)."""
        self.meta.execute(
            'UPDATE sessions SET project_id = ? WHERE session_id = ? AND tenant = ?', (project_id, session_id, tenant)
        )

    def finish_session(self, session_id: str, reason: str | None = None, detail: str | None = None) -> None:
        """Mark a session finished; the first reason reported stays (a later one is ignored)."""
        self.meta.execute(
            'UPDATE sessions SET finished = 1, finish_reason = COALESCE(finish_reason, ?), '
            'finish_detail = CASE WHEN finish_reason IS NULL THEN ? ELSE finish_detail END WHERE session_id = ?',
            (reason, detail, session_id),
        )

    # ---- training runs -------------------------------------------------------------------------------------
    def add_training_run(
        self,
        run_id: str,
        tenant: str,
        session_id: str,
        base_model: str,
        lora_config: dict[str, Any],
        user_metadata: Any = None,
    ) -> None:
        now = time.time()
        self.meta.execute(
            _upsert('training_runs', _RUN, 'run_id'),
            (run_id, tenant, session_id, base_model, json.dumps(lora_config), json.dumps(user_metadata), now, now, 0),
        )

    def training_run(self, run_id: str, tenant: str) -> TrainingRunRow | None:
        row = self.meta.one(f'SELECT {_RUN} FROM training_runs WHERE run_id = ? AND tenant = ?', (run_id, tenant))
        return _run(row) if row else None

    def training_runs(
        self, tenant: str, limit: int, offset: int, *, accessible: bool = False
    ) -> tuple[list[TrainingRunRow], int]:
        """A page of `tenant`'s training runs, newest first (`accessible`: and the runs of other tenants that
        have a published checkpoint), and how many there are in all."""
        where = 'tenant = ?'
        params: tuple[Any, ...] = (tenant,)
        if accessible:
            where = (
                'tenant = ? OR run_id IN (SELECT run_id FROM checkpoints WHERE public = 1 AND listed = 1 '
                'AND (expires_at IS NULL OR expires_at > ?))'
            )
            params = (tenant, time.time())
        rows, total = self.meta.read(
            frozenset({'training_runs', 'checkpoints'}),
            lambda s: (
                s.all(
                    f'SELECT {_RUN} FROM training_runs WHERE {where} ORDER BY created_at DESC LIMIT ? OFFSET ?',
                    (*params, limit, offset),
                ),
                s.one(f'SELECT COUNT(*) FROM training_runs WHERE {where}', params),
            ),
        )
        return [_run(r) for r in rows], int(total[0] if total else 0)

    def accessible_training_run(self, run_id: str, tenant: str) -> TrainingRunRow | None:
        """`tenant`'s run, or another tenant's run with a published checkpoint."""
        row = self.meta.one(
            f'SELECT {_RUN} FROM training_runs WHERE run_id = ? AND (tenant = ? OR run_id IN (SELECT run_id FROM '
            f'checkpoints WHERE public = 1 AND listed = 1 AND (expires_at IS NULL OR expires_at > ?)))',
            (run_id, tenant, time.time()),
        )
        return _run(row) if row else None

    def count_training_runs(self, tenant: str) -> int:
        row = self.meta.one('SELECT COUNT(*) FROM training_runs WHERE tenant = ?', (tenant,))
        return int(row[0]) if row else 0

    def touch_training_run(self, run_id: str) -> None:
        self.meta.execute(
            'UPDATE training_runs SET last_request_time = ? WHERE run_id = ?',
            (time.time(), run_id),
            key=('last_request_time', run_id),
        )

    def mark_corrupted(self, run_id: str) -> None:
        self.meta.execute('UPDATE training_runs SET corrupted = 1 WHERE run_id = ?', (run_id,))

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def put_checkpoint(self, row: CheckpointRow) -> None:
        """Record a (re)written checkpoint; the hub push of an earlier checkpoint under its name is dropped."""
        self.meta.write(
            Write(
                (
                    (
                        _upsert('checkpoints', _CKPT, 'run_id, checkpoint_id'),
                        (
                            row.run_id,
                            row.checkpoint_id,
                            row.tenant,
                            row.kind,
                            row.directory,
                            row.size_bytes,
                            row.created_at,
                            json.dumps(row.user_metadata),
                            row.expires_at,
                            int(row.listed),
                            int(row.public),
                        ),
                    ),
                    (
                        'DELETE FROM checkpoint_pushes WHERE run_id = ? AND checkpoint_id = ?',
                        (row.run_id, row.checkpoint_id),
                    ),
                )
            )
        )

    def checkpoint(self, run_id: str, checkpoint_id: str, tenant: str) -> CheckpointRow | None:
        """`tenant`'s checkpoint, unless it has expired."""
        row = self.meta.one(
            f'SELECT {_CKPT} FROM checkpoints WHERE run_id = ? AND checkpoint_id = ? AND tenant = ? AND {_LIVE}',
            (run_id, checkpoint_id, tenant, time.time()),
        )
        return _ckpt(row) if row else None

    def readable_checkpoint(self, run_id: str, checkpoint_id: str, tenant: str) -> CheckpointRow | None:
        """A checkpoint `tenant` may read: its own, or a published one of another tenant (unless expired)."""
        row = self.meta.one(
            f'SELECT {_CKPT} FROM checkpoints WHERE run_id = ? AND checkpoint_id = ? AND (tenant = ? OR '
            f'(public = 1 AND listed = 1)) AND {_LIVE}',
            (run_id, checkpoint_id, tenant, time.time()),
        )
        return _ckpt(row) if row else None

    def checkpoints(self, tenant: str, run_id: str | None = None, *, hidden: bool = False) -> list[CheckpointRow]:
        """Listed checkpoints (newest first); `hidden=True` returns the unlisted sampling snapshots instead.
        Expired ones are left out (the sweeper deletes them soon)."""
        listed = 0 if hidden else 1
        if run_id is None:
            rows = self.meta.all(
                f'SELECT {_CKPT} FROM checkpoints WHERE tenant = ? AND listed = ? AND {_LIVE} ORDER BY created_at DESC',
                (tenant, listed, time.time()),
            )
        else:
            rows = self.meta.all(
                f'SELECT {_CKPT} FROM checkpoints WHERE tenant = ? AND run_id = ? AND listed = ? AND {_LIVE} '
                f'ORDER BY created_at DESC',
                (tenant, run_id, listed, time.time()),
            )
        return [_ckpt(r) for r in rows]

    def public_checkpoints(self, run_id: str) -> list[CheckpointRow]:
        """The published, live checkpoints of a run (what another tenant sees of it), newest first."""
        rows = self.meta.all(
            f'SELECT {_CKPT} FROM checkpoints WHERE run_id = ? AND public = 1 AND listed = 1 AND {_LIVE} '
            f'ORDER BY created_at DESC',
            (run_id, time.time()),
        )
        return [_ckpt(r) for r in rows]

    def set_checkpoint_public(self, run_id: str, checkpoint_id: str, tenant: str, public: bool) -> int:
        """Publish or unpublish `tenant`'s checkpoint; the rows changed (0: unknown, or already so)."""
        return self.meta.execute(
            f'UPDATE checkpoints SET public = ? WHERE run_id = ? AND checkpoint_id = ? AND tenant = ? AND public = ? '
            f'AND {_LIVE}',
            (int(public), run_id, checkpoint_id, tenant, int(not public), time.time()),
        )

    def set_checkpoint_expiry(self, run_id: str, checkpoint_id: str, tenant: str, expires_at: float | None) -> int:
        """Set (None: remove) the expiry of `tenant`'s live checkpoint; the rows changed."""
        return self.meta.execute(
            f'UPDATE checkpoints SET expires_at = ? WHERE run_id = ? AND checkpoint_id = ? AND tenant = ? AND {_LIVE}',
            (expires_at, run_id, checkpoint_id, tenant, time.time()),
        )

    def expired_checkpoints(self, now: float, limit: int = 1000) -> list[CheckpointRow]:
        """Checkpoints of every tenant whose expiry has passed (for the sweeper that deletes them)."""
        rows = self.meta.all(
            f'SELECT {_CKPT} FROM checkpoints WHERE expires_at IS NOT NULL AND expires_at <= ? '
            f'ORDER BY expires_at LIMIT ?',
            (now, limit),
        )
        return [_ckpt(r) for r in rows]

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> None:
        self.meta.write(
            Write(
                (
                    ('DELETE FROM checkpoints WHERE run_id = ? AND checkpoint_id = ?', (run_id, checkpoint_id)),
                    ('DELETE FROM checkpoint_pushes WHERE run_id = ? AND checkpoint_id = ?', (run_id, checkpoint_id)),
                )
            )
        )

    def delete_expired_checkpoint(self, run_id: str, checkpoint_id: str, now: float) -> bool:
        """Delete the checkpoint's row if it is still expired at `now` (it may have been re-saved or given a new
        expiry since it was listed); True when it was deleted."""
        expired = 'run_id = ? AND checkpoint_id = ? AND expires_at IS NOT NULL AND expires_at <= ?'
        key = (run_id, checkpoint_id, now)
        return (
            self.meta.write(
                Write(
                    (
                        (
                            f'DELETE FROM checkpoint_pushes WHERE run_id = ? AND checkpoint_id = ? AND EXISTS '
                            f'(SELECT 1 FROM checkpoints WHERE {expired})',
                            (run_id, checkpoint_id, *key),
                        ),
                        (f'DELETE FROM checkpoints WHERE {expired}', key),
                    )
                )
            )
            > 0
        )

    # ---- checkpoint hub pushes -----------------------------------------------------------------------------
    def put_push(self, row: PushRow) -> None:
        self.meta.execute(
            _upsert('checkpoint_pushes', _PUSH, 'run_id, checkpoint_id'),
            (
                row.run_id,
                row.checkpoint_id,
                row.tenant,
                row.repo,
                row.path_in_repo,
                int(row.private),
                row.state,
                row.requested_at,
                row.pushed_at,
                row.error,
            ),
        )

    def finish_push(self, run_id: str, checkpoint_id: str, requested_at: float, error: str | None) -> bool:
        """Mark the push requested at `requested_at` pushed (`error` None) or failed. False when that push is no
        longer the checkpoint's (it was re-saved or deleted meanwhile)."""
        state, pushed_at = ('failed', None) if error else ('pushed', time.time())
        return (
            self.meta.execute(
                'UPDATE checkpoint_pushes SET state = ?, pushed_at = ?, error = ? '
                'WHERE run_id = ? AND checkpoint_id = ? AND requested_at = ?',
                (state, pushed_at, error, run_id, checkpoint_id, requested_at),
            )
            > 0
        )

    def push(self, run_id: str, checkpoint_id: str, tenant: str) -> PushRow | None:
        row = self.meta.one(
            f'SELECT {_PUSH} FROM checkpoint_pushes WHERE run_id = ? AND checkpoint_id = ? AND tenant = ?',
            (run_id, checkpoint_id, tenant),
        )
        return _push(row) if row else None

    def pushes(self, tenant: str, run_id: str | None = None) -> dict[tuple[str, str], PushRow]:
        """The pushes of `tenant`'s checkpoints (of one run), by (run_id, checkpoint_id)."""
        if run_id is None:
            rows = self.meta.all(f'SELECT {_PUSH} FROM checkpoint_pushes WHERE tenant = ?', (tenant,))
        else:
            rows = self.meta.all(
                f'SELECT {_PUSH} FROM checkpoint_pushes WHERE tenant = ? AND run_id = ?', (tenant, run_id)
            )
        return {(p.run_id, p.checkpoint_id): p for p in map(_push, rows)}

    def fail_pending_pushes(self, error: str) -> int:
        """Mark every push still pending failed (at start-up: the process that ran them is gone)."""
        return self.meta.execute(
            "UPDATE checkpoint_pushes SET state = 'failed', error = ? WHERE state = 'pending'", (error,)
        )

    # ---- sampling sessions ---------------------------------------------------------------------------------
    def add_sampling_session(self, row: SamplingSessionRow) -> None:
        self.meta.execute(
            _upsert('sampling_sessions', _SAMPLING, 'sampling_session_id'),
            (row.sampling_session_id, row.tenant, row.session_id, row.base_model, row.model_path, row.created_at),
        )

    def sampling_session(self, sampling_session_id: str, tenant: str) -> SamplingSessionRow | None:
        row = self.meta.one(
            f'SELECT {_SAMPLING} FROM sampling_sessions WHERE sampling_session_id = ? AND tenant = ?',
            (sampling_session_id, tenant),
        )
        return SamplingSessionRow(*row) if row else None

    def join_sampling_session(self, sampling_session_id: str, tenant: str, attempts: int = 100) -> int | None:
        """Allocate the next client number of `tenant`'s sampling session (1, 2, ...; the creating client is 0),
        unique even with several servers on one database (compare-and-set). None for an unknown session."""
        for _ in range(attempts):
            row = self.meta.one(
                'SELECT clients FROM sampling_sessions WHERE sampling_session_id = ? AND tenant = ?',
                (sampling_session_id, tenant),
            )
            if row is None:
                return None
            taken = int(row[0])
            if self.meta.execute(
                'UPDATE sampling_sessions SET clients = ? WHERE sampling_session_id = ? AND tenant = ? AND clients = ?',
                (taken + 1, sampling_session_id, tenant, taken),
            ):
                return taken + 1
        raise RuntimeError(f'could not allocate a client of sampling session {sampling_session_id!r}: too contended')

    # ---- futures -------------------------------------------------------------------------------------------
    def add_future(
        self,
        request_id: str,
        tenant: str,
        target: str | None = None,
        *,
        session_id: str | None = None,
        op: str | None = None,
        model_id: str | None = None,
    ) -> None:
        """A pending future; `target`: the sampling session (and client) whose `retrieve_futures` reports it;
        `session_id`, `op`, `model_id`: the session it belongs to, what it does and for which model (its trace)."""
        self.meta.execute(
            _upsert(
                'futures',
                'request_id, tenant, state, content_type, body, created_at, finished_at, owner, target, delivered, '
                'session_id, op, model_id',
                'request_id',
            ),
            (
                request_id,
                tenant,
                'pending',
                None,
                None,
                time.time(),
                None,
                self.owner,
                target,
                None,
                session_id,
                op,
                model_id,
            ),
        )

    def session_requests(self, session_id: str, tenant: str, limit: int) -> tuple[list[RequestRow], int]:
        """The newest `limit` futures of `tenant`'s session (newest first; the error body of failed ones only),
        and how many it has in all. Finished futures are pruned a day after they finish."""
        rows, total = self.meta.read(
            frozenset({'futures'}),
            lambda s: (
                s.all(
                    'SELECT request_id, op, model_id, target, state, created_at, finished_at, CASE WHEN state = '
                    "'failed' THEN body END FROM futures WHERE session_id = ? AND tenant = ? "
                    'ORDER BY created_at DESC, request_id DESC LIMIT ?',
                    (session_id, tenant, limit),
                ),
                s.one('SELECT COUNT(*) FROM futures WHERE session_id = ? AND tenant = ?', (session_id, tenant)),
            ),
        )
        out = [
            RequestRow(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                float(r[5]),
                None if r[6] is None else float(r[6]),
                None if r[7] is None else bytes(r[7]),
            )
            for r in rows
        ]
        return out, int(total[0]) if total else 0

    def finish_future(
        self, request_id: str, state: str, content_type: str, body: bytes, *, untarget: bool = False
    ) -> None:
        """Record a future's result; `untarget`: it is no longer reported to `retrieve_futures` (the client never
        learnt its id, e.g. a sample refused with 429)."""
        extra = ', target = NULL' if untarget else ''
        self.meta.execute(
            f'UPDATE futures SET state = ?, content_type = ?, body = ?, finished_at = ?{extra} WHERE request_id = ?',
            (state, content_type, body, time.time(), request_id),
        )

    def future(self, request_id: str, tenant: str) -> FutureRow | None:
        row = self.meta.one(
            'SELECT request_id, tenant, state, content_type, body, target FROM futures '
            'WHERE request_id = ? AND tenant = ?',
            (request_id, tenant),
        )
        if row is None:
            return None
        return FutureRow(row[0], row[1], row[2], row[3], bytes(row[4]) if row[4] is not None else None, row[5])

    def deliver_completions(
        self, tenant: str, target: str, prev_cursor: int
    ) -> tuple[list[tuple[str, str, int | None]], int]:
        """The finished futures of `tenant`'s `target` a `retrieve_futures` poll with `prev_cursor` has not seen
        acknowledged, as (request_id, state, payload bytes), and the cursor to answer with.

        Each finished future is stamped with the cursor of the answer that first reports it; a poll acknowledges
        every answer up to its `prev_cursor`, so a future is reported again only when the answer that carried it
        was lost (the client polls again with the older cursor). Cursors grow per target."""
        rows = self.meta.all(
            'SELECT request_id, state, LENGTH(body), delivered FROM futures WHERE target = ? AND tenant = ? '
            "AND state != 'pending' AND (delivered IS NULL OR delivered > ?) ORDER BY finished_at, request_id",
            (target, tenant, prev_cursor),
        )
        if not rows:
            return [], prev_cursor
        top = self.meta.one('SELECT MAX(delivered) FROM futures WHERE target = ? AND tenant = ?', (target, tenant))
        cursor = max(prev_cursor, int(top[0]) if top and top[0] is not None else 0) + 1
        new = [r[0] for r in rows if r[3] is None]
        for start in range(0, len(new), 500):
            chunk = new[start : start + 500]
            self.meta.execute(
                f'UPDATE futures SET delivered = ? WHERE target = ? AND tenant = ? AND delivered IS NULL '
                f'AND request_id IN ({", ".join("?" * len(chunk))})',
                (cursor, target, tenant, *chunk),
            )
        return [(r[0], r[1], None if r[2] is None else int(r[2])) for r in rows], cursor

    # ---- server settings and idempotent requests -----------------------------------------------------------
    def setting(self, name: str, default: str) -> str:
        """The server setting `name`, set to `default` by whichever server asks first (several servers sharing
        one database agree on it)."""
        self.meta.execute(
            'INSERT INTO server_settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING', (name, default)
        )
        row = self.meta.one('SELECT value FROM server_settings WHERE name = ?', (name,))
        return str(row[0]) if row else default

    def idempotent_result(self, tenant: str, key: str) -> str | None:
        """The result recorded for `tenant`'s request with this idempotency key."""
        row = self.meta.one(
            'SELECT result FROM idempotent_results WHERE tenant = ? AND idempotency_key = ?', (tenant, key)
        )
        return str(row[0]) if row else None

    def put_idempotent_result(self, tenant: str, key: str, result: str) -> str:
        """Record `result` for the key unless one is recorded already; the recorded result (first wins)."""
        self.meta.execute(
            'INSERT INTO idempotent_results (tenant, idempotency_key, result, created_at) VALUES (?, ?, ?, ?) '
            'ON CONFLICT (tenant, idempotency_key) DO NOTHING',
            (tenant, key, result, time.time()),
        )
        return self.idempotent_result(tenant, key) or result

    def prune_idempotent_results(self, older_than_s: float) -> int:
        return self.meta.execute('DELETE FROM idempotent_results WHERE created_at < ?', (time.time() - older_than_s,))

    def pending_futures(self) -> Iterator[str]:
        """Ids of unfinished futures: this server's and unowned ones (with an `owner`), else all."""
        if self.owner is None:
            rows = self.meta.all("SELECT request_id FROM futures WHERE state = 'pending'")
        else:
            rows = self.meta.all(
                "SELECT request_id FROM futures WHERE state = 'pending' AND (owner IS NULL OR owner = ?)", (self.owner,)
            )
        return iter([r[0] for r in rows])

    def prune_futures(self, older_than_s: float) -> int:
        """Drop finished futures older than `older_than_s` seconds (clients retrieve results within minutes)."""
        cutoff = time.time() - older_than_s
        return self.meta.execute("DELETE FROM futures WHERE state != 'pending' AND finished_at < ?", (cutoff,))


def _run(row: tuple[Any, ...]) -> TrainingRunRow:
    return TrainingRunRow(
        row[0],
        row[1],
        row[2],
        row[3],
        json.loads(row[4]),
        json.loads(row[5] or 'null'),
        float(row[6]),
        float(row[7]),
        bool(row[8]),
    )


def _ckpt(row: tuple[Any, ...]) -> CheckpointRow:
    return CheckpointRow(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        None if row[5] is None else int(row[5]),
        float(row[6]),
        json.loads(row[7] or 'null'),
        None if row[8] is None else float(row[8]),
        bool(row[9]),
        bool(row[10]),
    )


def _session(row: tuple[Any, ...]) -> SessionRow:
    tags = json.loads(row[5] or '[]')
    return SessionRow(
        row[0],
        row[1],
        float(row[2]),
        float(row[3]),
        bool(row[4]),
        tags if isinstance(tags, list) else [],
        json.loads(row[6] or 'null'),
        row[7],
        row[8],
        row[9],
        row[10],
    )


def _push(row: tuple[Any, ...]) -> PushRow:
    return PushRow(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        bool(row[5]),
        row[6],
        float(row[7]),
        None if row[8] is None else float(row[8]),
        row[9],
    )
