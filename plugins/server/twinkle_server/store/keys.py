"""The API keys table of the metadata store (`store.Store`): the salted key digests, and the tenants they name."""

from __future__ import annotations

import time

from twinkle_server.store.tables import StoreTables

__all__ = ['ApiKeyTables']


class ApiKeyTables(StoreTables):
    """API keys: add, look up (active ones, and whether one is an operator's), revoke a tenant's, and list the
    tenants with an active key."""

    def add_api_key(self, key_id: str, tenant: str, salt: bytes, digest: bytes, *, admin: bool = False) -> None:
        """`admin`: the key also opens the console's operator view (every tenant's work, server-wide)."""
        self.meta.execute(
            'INSERT INTO api_keys (key_id, tenant, salt, digest, created_at, revoked, admin) '
            'VALUES (?, ?, ?, ?, ?, 0, ?)',
            (key_id, tenant, salt, digest, time.time(), 1 if admin else 0),
        )

    def api_key(self, key_id: str) -> tuple[str, bytes, bytes] | None:
        """(tenant, salt, digest) of an active key."""
        row = self.meta.one('SELECT tenant, salt, digest FROM api_keys WHERE key_id = ? AND revoked = 0', (key_id,))
        return (row[0], bytes(row[1]), bytes(row[2])) if row else None

    def is_admin_key(self, key_id: str) -> bool:
        """Whether the active key `key_id` is an operator's (`twinkle server keys create --admin`)."""
        row = self.meta.one('SELECT admin FROM api_keys WHERE key_id = ? AND revoked = 0', (key_id,))
        return bool(row and row[0])

    def revoke_api_keys(self, tenant: str) -> int:
        return self.meta.execute('UPDATE api_keys SET revoked = 1 WHERE tenant = ?', (tenant,))

    def tenants(self) -> list[str]:
        return [r[0] for r in self.meta.all('SELECT DISTINCT tenant FROM api_keys WHERE revoked = 0 ORDER BY tenant')]
