"""The server settings and idempotent results tables of the metadata store (`store.Store`): values every server
sharing the database agrees on, and the recorded result of each request sent with an idempotency key."""

from __future__ import annotations

import time

from twinkle_server.store.tables import StoreTables

__all__ = ['SettingTables']


class SettingTables(StoreTables):
    """Server settings (first writer wins) and idempotent results (record, look up, prune)."""

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
