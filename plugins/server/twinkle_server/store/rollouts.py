"""The rollout tables of the metadata store (`store.Store`): rollout sessions on `/v1` (tenant-owned, with a
lifetime) and the calls each recorded, one JSON record per call (its prompt and sampled tokens: `service.rollouts`)."""

from __future__ import annotations

import json
from typing import Any

from twinkle_server.store.rows import RolloutRow
from twinkle_server.store.tables import StoreTables

__all__ = ['RolloutTables']

_ROLLOUT = 'session_id, tenant, model, created_at, expires_at, limits, rewards'


class RolloutTables(StoreTables):
    """Rollout sessions: create, look up (tenant-owned), count, reward, delete, find the expired; their calls."""

    def add_rollout(self, row: RolloutRow) -> None:
        self.meta.execute(
            f'INSERT INTO rollout_sessions ({_ROLLOUT}) VALUES (?, ?, ?, ?, ?, ?, ?)',
            (
                row.session_id,
                row.tenant,
                row.model,
                row.created_at,
                row.expires_at,
                json.dumps(row.limits),
                None if row.rewards is None else json.dumps(row.rewards),
            ),
        )

    def rollout(self, session_id: str, tenant: str) -> RolloutRow | None:
        """The session if `tenant` owns it (another tenant's id reads as absent)."""
        row = self.meta.one(
            f'SELECT {_ROLLOUT} FROM rollout_sessions WHERE session_id = ? AND tenant = ?', (session_id, tenant)
        )
        if row is None:
            return None
        sid, owner, model, created, expires, limits, rewards = row
        posted = json.loads(rewards) if rewards else None
        return RolloutRow(sid, owner, model, float(created), float(expires), json.loads(limits), posted)

    def count_live_rollouts(self, tenant: str, now: float) -> int:
        row = self.meta.one('SELECT COUNT(*) FROM rollout_sessions WHERE tenant = ? AND expires_at > ?', (tenant, now))
        return int(row[0]) if row else 0

    def set_rollout_rewards(self, session_id: str, rewards: dict[str, Any]) -> None:
        self.meta.execute(
            'UPDATE rollout_sessions SET rewards = ? WHERE session_id = ?', (json.dumps(rewards), session_id)
        )

    def delete_rollout(self, session_id: str) -> None:
        self.meta.execute('DELETE FROM rollout_calls WHERE session_id = ?', (session_id,))
        self.meta.execute('DELETE FROM rollout_sessions WHERE session_id = ?', (session_id,))

    def expired_rollouts(self, now: float) -> list[str]:
        return [r[0] for r in self.meta.all('SELECT session_id FROM rollout_sessions WHERE expires_at <= ?', (now,))]

    def add_rollout_call(self, session_id: str, seq: int, record: dict[str, Any]) -> None:
        self.meta.execute(
            'INSERT INTO rollout_calls (session_id, seq, record) VALUES (?, ?, ?)',
            (session_id, seq, json.dumps(record)),
        )

    def count_rollout_calls(self, session_id: str) -> int:
        row = self.meta.one('SELECT COUNT(*) FROM rollout_calls WHERE session_id = ?', (session_id,))
        return int(row[0]) if row else 0

    def rollout_calls(self, session_id: str) -> list[dict[str, Any]]:
        """The session's call records in the order they were recorded."""
        rows = self.meta.all('SELECT record FROM rollout_calls WHERE session_id = ? ORDER BY seq', (session_id,))
        return [json.loads(r[0]) for r in rows]
