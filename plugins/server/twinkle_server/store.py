"""SQLite metadata store: API keys, sessions, training runs, checkpoints, sampling sessions, finished futures.

One file (`<data_dir>/server.db`, WAL mode, mode 0600 with its -wal/-shm files: it holds the API key digests)
shared by every request thread behind one lock: the metadata
traffic is tiny next to the tensor work. Every read that returns tenant-owned data takes the tenant and
answers `None` for another tenant's id, so routes can turn it into a 404 without ever revealing that the id
exists. Checkpoint *files* live beside it (see `checkpoints.py`); the rows here only describe them.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, salt BLOB NOT NULL, digest BLOB NOT NULL,
    created_at REAL NOT NULL, revoked INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at REAL NOT NULL, last_seen REAL NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0, tags TEXT, user_metadata TEXT);
CREATE TABLE IF NOT EXISTS training_runs (
    run_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT NOT NULL, base_model TEXT NOT NULL,
    lora_config TEXT NOT NULL, user_metadata TEXT, created_at REAL NOT NULL, last_request_time REAL NOT NULL,
    corrupted INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS training_runs_tenant ON training_runs (tenant, created_at);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id TEXT NOT NULL, checkpoint_id TEXT NOT NULL, tenant TEXT NOT NULL, kind TEXT NOT NULL,
    directory TEXT NOT NULL, size_bytes INTEGER, created_at REAL NOT NULL, user_metadata TEXT,
    expires_at REAL, listed INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (run_id, checkpoint_id));
CREATE INDEX IF NOT EXISTS checkpoints_tenant ON checkpoints (tenant, created_at);
CREATE TABLE IF NOT EXISTS sampling_sessions (
    sampling_session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT, base_model TEXT NOT NULL,
    model_path TEXT, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS futures (
    request_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, content_type TEXT,
    body BLOB, created_at REAL NOT NULL, finished_at REAL);
"""


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


class Store:
    """Thread-safe access to the metadata database in `data_dir`."""

    def __init__(self, data_dir: str | Path) -> None:
        self.path = Path(data_dir) / 'server.db'
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))  # created private, never world-readable
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute('PRAGMA journal_mode=WAL')
        self._db.execute('PRAGMA synchronous=NORMAL')
        self._db.executescript(SCHEMA)
        self._make_private()

    def _make_private(self) -> None:
        """sqlite creates -wal/-shm with the database's mode; enforce 0600 on all three (older files too)."""
        for suffix in ('', '-wal', '-shm'):
            f = Path(f'{self.path}{suffix}')
            if f.exists():
                os.chmod(f, 0o600)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- plumbing ------------------------------------------------------------------------------------------
    def _exec(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._db.execute(sql, params)

    def _one(self, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        with self._lock:
            return self._db.execute(sql, params).fetchone()

    def _all(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # ---- API keys ------------------------------------------------------------------------------------------
    def add_api_key(self, key_id: str, tenant: str, salt: bytes, digest: bytes) -> None:
        self._exec('INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, 0)', (key_id, tenant, salt, digest, time.time()))

    def api_key(self, key_id: str) -> tuple[str, bytes, bytes] | None:
        """(tenant, salt, digest) of an active key."""
        row = self._one('SELECT tenant, salt, digest FROM api_keys WHERE key_id = ? AND revoked = 0', (key_id,))
        return (row[0], bytes(row[1]), bytes(row[2])) if row else None

    def revoke_api_keys(self, tenant: str) -> int:
        return self._exec('UPDATE api_keys SET revoked = 1 WHERE tenant = ?', (tenant,)).rowcount

    def tenants(self) -> list[str]:
        return [r[0] for r in self._all('SELECT DISTINCT tenant FROM api_keys WHERE revoked = 0 ORDER BY tenant')]

    # ---- sessions ------------------------------------------------------------------------------------------
    def add_session(self, session_id: str, tenant: str, tags: list[str], user_metadata: Any) -> None:
        now = time.time()
        self._exec('INSERT INTO sessions VALUES (?, ?, ?, ?, 0, ?, ?)',
                   (session_id, tenant, now, now, json.dumps(tags), json.dumps(user_metadata)))

    def session_state(self, session_id: str, tenant: str) -> str | None:
        """'active', 'finished', or None when the session is unknown to this tenant."""
        row = self._one('SELECT finished FROM sessions WHERE session_id = ? AND tenant = ?', (session_id, tenant))
        return None if row is None else ('finished' if row[0] else 'active')

    def touch_session(self, session_id: str) -> None:
        self._exec('UPDATE sessions SET last_seen = ? WHERE session_id = ?', (time.time(), session_id))

    def session_last_seen(self, session_id: str) -> float | None:
        """Last heartbeat time of an active session; None when finished or unknown."""
        row = self._one('SELECT last_seen FROM sessions WHERE session_id = ? AND finished = 0', (session_id,))
        return float(row[0]) if row else None

    def count_live_sessions(self, tenant: str, seen_since: float) -> int:
        """Unfinished sessions of `tenant` that heart-beat after `seen_since`."""
        row = self._one('SELECT COUNT(*) FROM sessions WHERE tenant = ? AND finished = 0 AND last_seen >= ?',
                        (tenant, seen_since))
        return int(row[0]) if row else 0

    def finish_session(self, session_id: str) -> None:
        self._exec('UPDATE sessions SET finished = 1 WHERE session_id = ?', (session_id,))

    # ---- training runs -------------------------------------------------------------------------------------
    def add_training_run(self, run_id: str, tenant: str, session_id: str, base_model: str,
                         lora_config: dict[str, Any], user_metadata: Any = None) -> None:
        now = time.time()
        self._exec('INSERT OR REPLACE INTO training_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)',
                   (run_id, tenant, session_id, base_model, json.dumps(lora_config), json.dumps(user_metadata),
                    now, now))

    def training_run(self, run_id: str, tenant: str) -> TrainingRunRow | None:
        row = self._one('SELECT * FROM training_runs WHERE run_id = ? AND tenant = ?', (run_id, tenant))
        return _run(row) if row else None

    def training_runs(self, tenant: str, limit: int, offset: int) -> tuple[list[TrainingRunRow], int]:
        rows = self._all('SELECT * FROM training_runs WHERE tenant = ? ORDER BY created_at DESC LIMIT ? OFFSET ?',
                         (tenant, limit, offset))
        total = self._one('SELECT COUNT(*) FROM training_runs WHERE tenant = ?', (tenant,))
        return [_run(r) for r in rows], int(total[0] if total else 0)

    def count_training_runs(self, tenant: str) -> int:
        row = self._one('SELECT COUNT(*) FROM training_runs WHERE tenant = ?', (tenant,))
        return int(row[0]) if row else 0

    def touch_training_run(self, run_id: str) -> None:
        self._exec('UPDATE training_runs SET last_request_time = ? WHERE run_id = ?', (time.time(), run_id))

    def mark_corrupted(self, run_id: str) -> None:
        self._exec('UPDATE training_runs SET corrupted = 1 WHERE run_id = ?', (run_id,))

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def put_checkpoint(self, row: CheckpointRow) -> None:
        self._exec('INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
                   (row.run_id, row.checkpoint_id, row.tenant, row.kind, row.directory, row.size_bytes,
                    row.created_at, json.dumps(row.user_metadata), row.expires_at, int(row.listed)))

    def checkpoint(self, run_id: str, checkpoint_id: str, tenant: str) -> CheckpointRow | None:
        row = self._one('SELECT * FROM checkpoints WHERE run_id = ? AND checkpoint_id = ? AND tenant = ?',
                        (run_id, checkpoint_id, tenant))
        return _ckpt(row) if row else None

    def checkpoints(self, tenant: str, run_id: str | None = None, *, hidden: bool = False) -> list[CheckpointRow]:
        """Listed checkpoints (newest first); `hidden=True` returns the unlisted sampling snapshots instead."""
        listed = 0 if hidden else 1
        if run_id is None:
            rows = self._all('SELECT * FROM checkpoints WHERE tenant = ? AND listed = ? ORDER BY created_at DESC',
                             (tenant, listed))
        else:
            rows = self._all('SELECT * FROM checkpoints WHERE tenant = ? AND run_id = ? AND listed = ? '
                             'ORDER BY created_at DESC', (tenant, run_id, listed))
        return [_ckpt(r) for r in rows]

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> None:
        self._exec('DELETE FROM checkpoints WHERE run_id = ? AND checkpoint_id = ?', (run_id, checkpoint_id))

    # ---- sampling sessions ---------------------------------------------------------------------------------
    def add_sampling_session(self, row: SamplingSessionRow) -> None:
        self._exec('INSERT OR REPLACE INTO sampling_sessions VALUES (?, ?, ?, ?, ?, ?)',
                   (row.sampling_session_id, row.tenant, row.session_id, row.base_model, row.model_path,
                    row.created_at))

    def sampling_session(self, sampling_session_id: str, tenant: str) -> SamplingSessionRow | None:
        row = self._one('SELECT * FROM sampling_sessions WHERE sampling_session_id = ? AND tenant = ?',
                        (sampling_session_id, tenant))
        return SamplingSessionRow(*row) if row else None

    # ---- futures -------------------------------------------------------------------------------------------
    def add_future(self, request_id: str, tenant: str) -> None:
        self._exec('INSERT OR REPLACE INTO futures VALUES (?, ?, ?, NULL, NULL, ?, NULL)',
                   (request_id, tenant, 'pending', time.time()))

    def finish_future(self, request_id: str, state: str, content_type: str, body: bytes) -> None:
        self._exec('UPDATE futures SET state = ?, content_type = ?, body = ?, finished_at = ? WHERE request_id = ?',
                   (state, content_type, body, time.time(), request_id))

    def future(self, request_id: str, tenant: str) -> FutureRow | None:
        row = self._one('SELECT request_id, tenant, state, content_type, body FROM futures '
                        'WHERE request_id = ? AND tenant = ?', (request_id, tenant))
        return FutureRow(row[0], row[1], row[2], row[3], bytes(row[4]) if row[4] is not None else None) \
            if row else None

    def pending_futures(self) -> Iterator[str]:
        return iter([r[0] for r in self._all("SELECT request_id FROM futures WHERE state = 'pending'")])

    def prune_futures(self, older_than_s: float) -> int:
        """Drop finished futures older than `older_than_s` seconds (clients retrieve results within minutes)."""
        cutoff = time.time() - older_than_s
        return self._exec("DELETE FROM futures WHERE state != 'pending' AND finished_at < ?", (cutoff,)).rowcount


def _run(row: tuple[Any, ...]) -> TrainingRunRow:
    return TrainingRunRow(row[0], row[1], row[2], row[3], json.loads(row[4]), json.loads(row[5] or 'null'),
                          row[6], row[7], bool(row[8]))


def _ckpt(row: tuple[Any, ...]) -> CheckpointRow:
    return CheckpointRow(row[0], row[1], row[2], row[3], row[4], row[5], row[6], json.loads(row[7] or 'null'),
                         row[8], bool(row[9]))
