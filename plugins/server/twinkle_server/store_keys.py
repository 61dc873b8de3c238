"""The API keys table of the metadata store (`store.Store`): the salted key digests, and the tenants they name."""

from __future__ import annotations

import time

from twinkle_server.store_tables import StoreTables

__all__ = ['ApiKeyTables']


class ApiKeyTables(StoreTables):
    """API keys: add, look up (active ones), revoke a tenant's, and list the tenants with an active key."""

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
