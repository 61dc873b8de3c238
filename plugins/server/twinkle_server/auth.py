"""The import path of API keys published before the server's layers (``from twinkle_server.auth import
create_api_key``); they live in `twinkle_server.service.auth` now."""

from twinkle_server.service.auth import LoginThrottle, Tenant, authenticate, create_api_key, key_from_headers

__all__ = ['LoginThrottle', 'Tenant', 'authenticate', 'create_api_key', 'key_from_headers']
