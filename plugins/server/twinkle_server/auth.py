"""API keys: `tml-<key id><secret>`; stored as sha256(salt + secret), compared in constant time.

The key id (the first 12 characters after `tml-`) is a lookup handle, not a secret: it finds the row, the
secret is then checked against the salted digest with `hmac.compare_digest`. A missing, malformed, unknown
or revoked key is always the same 401, so a caller learns nothing about which part was wrong.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from twinkle_server.errors import ApiError
from twinkle_server.quotas import MinuteWindow
from twinkle_server.store import Store

PREFIX = 'tml-'
KEY_ID_LEN = 12


@dataclass(frozen=True)
class Tenant:
    """The authenticated caller. Every tenant-owned row is looked up with `name`."""
    name: str
    key_id: str


def create_api_key(store: Store, tenant: str) -> str:
    """Issue a new key for `tenant` and store only its salted digest. The key is shown once."""
    if not tenant or not tenant.replace('-', '').replace('_', '').replace('.', '').isalnum():
        raise ValueError(f'tenant name {tenant!r} must be non-empty and use only letters, digits, "-", "_", "."')
    key_id = secrets.token_hex(KEY_ID_LEN // 2)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_bytes(16)
    store.add_api_key(key_id, tenant, salt, _digest(salt, secret))
    return f'{PREFIX}{key_id}{secret}'


def authenticate(store: Store, api_key: str | None) -> Tenant:
    """The tenant owning `api_key`, or a 401 `ApiError`."""
    if not api_key or not api_key.startswith(PREFIX) or len(api_key) <= len(PREFIX) + KEY_ID_LEN:
        raise _unauthorized()
    key_id, secret = api_key[len(PREFIX):len(PREFIX) + KEY_ID_LEN], api_key[len(PREFIX) + KEY_ID_LEN:]
    row = store.api_key(key_id)
    if row is None:
        _digest(b'0' * 16, secret)  # same work as a real check
        raise _unauthorized()
    tenant, salt, digest = row
    if not hmac.compare_digest(_digest(salt, secret), digest):
        raise _unauthorized()
    return Tenant(tenant, key_id)


def key_from_headers(x_api_key: str | None, authorization: str | None) -> str | None:
    """The API key a request carries: `X-API-Key`, else `Authorization: Bearer <key>`."""
    if x_api_key is None and (authorization or '').lower().startswith('bearer '):
        return authorization[7:]  # type: ignore[index]
    return x_api_key


def _digest(salt: bytes, secret: str) -> bytes:
    return hashlib.sha256(salt + secret.encode()).digest()


def _unauthorized() -> ApiError:
    return ApiError(401, 'Missing or invalid API key: send a key issued by `twinkle server keys create --tenant NAME` '
                         'in the X-API-Key header.')


class LoginThrottle:
    """Failed logins per client address in a sliding minute; past `max_per_minute` the address is answered 429
    (with Retry-After) without checking its key, so keys cannot be guessed at request rate."""

    def __init__(self, max_per_minute: int) -> None:
        self.max_per_minute = max_per_minute
        self._failures = MinuteWindow()

    def check(self, address: str) -> None:
        self._failures.admit(address, self.max_per_minute, f'too many failed logins from {address}', record=False)

    def failed(self, address: str) -> None:
        self._failures.record(address)

    def reset(self) -> None:
        self._failures.reset()
