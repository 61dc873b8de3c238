"""Numbered schema migrations, applied in order at open inside one transaction.

`schema_migrations` records each applied version (and when). A database is migrated by whichever server opens
it first: on PostgreSQL under an advisory lock, on SQLite under the file's write lock, so two servers starting
at once never apply a migration twice. A SQLite file written before migrations existed (it has the tables but
no `schema_migrations`) holds exactly migration 1: it is stamped as version 1, not re-created. A database newer
than this code (a version it does not know) is refused.

Migrations are append-only: never edit a released one, add the next number. Column types are written neutrally
(``{INT}`` 64-bit integer, ``{REAL}`` double, ``{BLOB}`` bytes) and filled in per dialect.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from twinkle_server.store.db.base import Database, DatabaseError, Session


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        'initial schema',
        (
            """CREATE TABLE IF NOT EXISTS api_keys (
            key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, salt {BLOB} NOT NULL, digest {BLOB} NOT NULL,
            created_at {REAL} NOT NULL, revoked {INT} NOT NULL DEFAULT 0)""",
            """CREATE TABLE IF NOT EXISTS sessions (
            session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at {REAL} NOT NULL,
            last_seen {REAL} NOT NULL, finished {INT} NOT NULL DEFAULT 0, tags TEXT, user_metadata TEXT)""",
            """CREATE TABLE IF NOT EXISTS training_runs (
            run_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT NOT NULL, base_model TEXT NOT NULL,
            lora_config TEXT NOT NULL, user_metadata TEXT, created_at {REAL} NOT NULL,
            last_request_time {REAL} NOT NULL, corrupted {INT} NOT NULL DEFAULT 0)""",
            'CREATE INDEX IF NOT EXISTS training_runs_tenant ON training_runs (tenant, created_at)',
            """CREATE TABLE IF NOT EXISTS checkpoints (
            run_id TEXT NOT NULL, checkpoint_id TEXT NOT NULL, tenant TEXT NOT NULL, kind TEXT NOT NULL,
            directory TEXT NOT NULL, size_bytes {INT}, created_at {REAL} NOT NULL, user_metadata TEXT,
            expires_at {REAL}, listed {INT} NOT NULL DEFAULT 1, PRIMARY KEY (run_id, checkpoint_id))""",
            'CREATE INDEX IF NOT EXISTS checkpoints_tenant ON checkpoints (tenant, created_at)',
            """CREATE TABLE IF NOT EXISTS sampling_sessions (
            sampling_session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT, base_model TEXT NOT NULL,
            model_path TEXT, created_at {REAL} NOT NULL)""",
            """CREATE TABLE IF NOT EXISTS futures (
            request_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, content_type TEXT,
            body {BLOB}, created_at {REAL} NOT NULL, finished_at {REAL})""",
        ),
    ),
    Migration(
        2,
        'checkpoint hub pushes',
        (
            """CREATE TABLE checkpoint_pushes (
            run_id TEXT NOT NULL, checkpoint_id TEXT NOT NULL, tenant TEXT NOT NULL, repo TEXT NOT NULL,
            path_in_repo TEXT NOT NULL, private {INT} NOT NULL, state TEXT NOT NULL, requested_at {REAL} NOT NULL,
            pushed_at {REAL}, error TEXT, PRIMARY KEY (run_id, checkpoint_id))""",
        ),
    ),
    Migration(3, 'owner of each future', ('ALTER TABLE futures ADD COLUMN owner TEXT',)),
    Migration(
        4,
        'sessions, published checkpoints, sampling-session futures, server settings, idempotent requests',
        (
            'ALTER TABLE sessions ADD COLUMN project_id TEXT',
            'ALTER TABLE sessions ADD COLUMN display_name TEXT',
            'ALTER TABLE sessions ADD COLUMN finish_reason TEXT',
            'ALTER TABLE sessions ADD COLUMN finish_detail TEXT',
            'CREATE INDEX sessions_tenant ON sessions (tenant, created_at)',
            'CREATE INDEX training_runs_session ON training_runs (session_id)',
            'ALTER TABLE checkpoints ADD COLUMN public {INT} NOT NULL DEFAULT 0',
            'CREATE INDEX checkpoints_expiry ON checkpoints (expires_at)',
            'ALTER TABLE sampling_sessions ADD COLUMN clients {INT} NOT NULL DEFAULT 0',
            'CREATE INDEX sampling_sessions_session ON sampling_sessions (session_id)',
            'ALTER TABLE futures ADD COLUMN target TEXT',
            'ALTER TABLE futures ADD COLUMN delivered {INT}',
            'CREATE INDEX futures_target ON futures (target)',
            'CREATE TABLE server_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)',
            """CREATE TABLE idempotent_results (
            tenant TEXT NOT NULL, idempotency_key TEXT NOT NULL, result TEXT NOT NULL, created_at {REAL} NOT NULL,
            PRIMARY KEY (tenant, idempotency_key))""",
        ),
    ),
    Migration(
        5,
        'session, operation and model of each future (session trace export)',
        (
            'ALTER TABLE futures ADD COLUMN session_id TEXT',
            'ALTER TABLE futures ADD COLUMN op TEXT',
            'ALTER TABLE futures ADD COLUMN model_id TEXT',
            'CREATE INDEX futures_session ON futures (session_id, created_at)',
        ),
    ),
    Migration(
        6,
        'console: operator (admin) keys, per-step metrics of training runs',
        (
            'ALTER TABLE api_keys ADD COLUMN admin {INT} NOT NULL DEFAULT 0',
            """CREATE TABLE run_metrics (
            run_id TEXT NOT NULL, op TEXT NOT NULL, step {INT} NOT NULL, tenant TEXT NOT NULL,
            created_at {REAL} NOT NULL, metrics TEXT NOT NULL, PRIMARY KEY (run_id, op, step))""",
        ),
    ),
    Migration(
        7,
        'rollout sessions on /v1 and the calls they recorded (as tokens)',
        (
            """CREATE TABLE rollout_sessions (
            session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, model TEXT NOT NULL, created_at {REAL} NOT NULL,
            expires_at {REAL} NOT NULL, limits TEXT NOT NULL, rewards TEXT)""",
            'CREATE INDEX rollout_sessions_tenant ON rollout_sessions (tenant, expires_at)',
            """CREATE TABLE rollout_calls (
            session_id TEXT NOT NULL, seq {INT} NOT NULL, record TEXT NOT NULL, PRIMARY KEY (session_id, seq))""",
        ),
    ),
)
LATEST = MIGRATIONS[-1].version
LEGACY_TABLE = 'api_keys'  # present in every database written before schema_migrations existed


def migrate(db: Database, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
    """Bring `db` to the newest schema; returns the versions applied now (empty when it was up to date).
    Raises `DatabaseError` for a database newer than `migrations`, or when a migration fails (nothing of it
    is kept)."""
    try:
        with db.transaction() as s:
            db.lock_for_migrations(s)
            s.execute(
                _ddl(
                    db,
                    'CREATE TABLE IF NOT EXISTS schema_migrations ('
                    'version {INT} PRIMARY KEY, applied_at {REAL} NOT NULL, description TEXT)',
                )
            )
            applied = {int(r[0]) for r in s.all('SELECT version FROM schema_migrations')}
            if not applied and db.has_table(s, LEGACY_TABLE):
                _record(s, migrations[0], 'stamped: schema written before migrations existed')
                applied.add(migrations[0].version)
            newest = max(applied, default=0)
            known = max((m.version for m in migrations), default=0)
            if newest > known:
                raise DatabaseError(
                    f'the metadata database {db.url} has schema version {newest}, newer than this '
                    f'twinkle-server knows ({known}); upgrade twinkle-server'
                )
            done = []
            for m in sorted(migrations, key=lambda m: m.version):
                if m.version not in applied:
                    for statement in m.statements:
                        s.execute(_ddl(db, statement))
                    _record(s, m, m.description)
                    done.append(m.version)
            return done
    except DatabaseError:
        raise
    except Exception as exc:  # noqa: BLE001 - a driver error becomes one message naming the database
        raise DatabaseError(f'migrating the metadata database {db.url} failed: {type(exc).__name__}: {exc}') from exc


def applied_versions(db: Database) -> list[int]:
    """The versions recorded in `schema_migrations`, ascending."""
    return [int(r[0]) for r in db.all('SELECT version FROM schema_migrations ORDER BY version')]


def _record(s: Session, m: Migration, description: str) -> None:
    s.execute(
        'INSERT INTO schema_migrations (version, applied_at, description) VALUES (?, ?, ?)',
        (m.version, time.time(), description),
    )


def _ddl(db: Database, statement: str) -> str:
    return statement.format(**db.types)
