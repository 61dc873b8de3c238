"""The sessions table of the metadata store (`store.Store`): a tenant's client sessions, their heartbeats, what
they created and how they finished."""

from __future__ import annotations

import json
import time
from typing import Any

from twinkle_server.store.rows import SessionRow
from twinkle_server.store.tables import StoreTables

__all__ = ['SessionTables']

_SESSION = (
    'session_id, tenant, created_at, last_seen, finished, tags, user_metadata, project_id, display_name, '
    'finish_reason, finish_detail'
)


class SessionTables(StoreTables):
    """Sessions: create, look up and list (tenant-owned), heartbeat, move to a project, finish; and what a session
    holds (its training runs and sampling sessions, its runs' checkpoint totals)."""

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
