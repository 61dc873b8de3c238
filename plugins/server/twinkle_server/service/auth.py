"""API keys: `tml-<key id><secret>`; stored as sha256(salt + secret), compared in constant time.

The key id (the first 12 characters after `tml-`) is a lookup handle, not a secret: it finds the row, the
secret is then checked against the salted digest with `hmac.compare_digest`. A missing, malformed, unknown
or revoked key is always the same 401, so a caller learns nothing about which part was wrong.

Failed logins are throttled (`LoginThrottle`) per client address *and key id*, so one caller's guesses never lock
out another tenant's valid key; the address is the peer's, or the one a trusted proxy forwarded (`launch.py`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from twinkle_server.errors import ApiError
from twinkle_server.service.quotas import MinuteWindow
from twinkle_server.store import Store

PREFIX = 'tml-'
KEY_ID_LEN = 12


@dataclass(frozen=True)
class Tenant:
    """The authenticated caller. Every tenant-owned row is looked up with `name`."""

    name: str
    key_id: str


def create_api_key(store: Store, tenant: str, *, admin: bool = False) -> str:
    """Issue a new key for `tenant` and store only its salted digest. The key is shown once. `admin`: an
    operator's key, which also opens the console's server-wide operator view."""
    if not tenant or not tenant.replace('-', '').replace('_', '').replace('.', '').isalnum():
        raise ValueError(f'tenant name {tenant!r} must be non-empty and use only letters, digits, "-", "_", "."')
    key_id = secrets.token_hex(KEY_ID_LEN // 2)
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_bytes(16)
    store.add_api_key(key_id, tenant, salt, _digest(salt, secret), admin=admin)
    return f'{PREFIX}{key_id}{secret}'


def authenticate(store: Store, api_key: str | None) -> Tenant:
    """The tenant owning `api_key`, or a 401 `ApiError`."""
    parts = split_key(api_key)
    return _verify(parts, store.api_key(parts[0]) if parts else None)


def split_key(api_key: str | None) -> tuple[str, str] | None:
    """(key id, secret) of a well-formed key, else None."""
    if not api_key or not api_key.startswith(PREFIX) or len(api_key) <= len(PREFIX) + KEY_ID_LEN:
        return None
    return api_key[len(PREFIX) : len(PREFIX) + KEY_ID_LEN], api_key[len(PREFIX) + KEY_ID_LEN :]


def _verify(parts: tuple[str, str] | None, row: tuple[str, bytes, bytes] | None) -> Tenant:
    """The tenant of the key split into `parts`, given its stored `row` (None: no such active key id)."""
    if parts is None:
        raise _unauthorized()
    key_id, secret = parts
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
    return ApiError(
        401,
        'Missing or invalid API key: send a key issued by `twinkle server keys create --tenant NAME` '
        'in the X-API-Key header.',
    )


class LoginThrottle:
    """Failed logins in a sliding minute, counted where they cannot hurt anyone else:

    - per (client address, key id) for a key id that exists: past `max_per_minute` that pair is answered 429
      (with Retry-After) without checking its secret;
    - per client address for keys whose id does not exist (or malformed or missing keys): past `max_per_minute`
      such keys from that address are answered 429 without checking them.

    A valid key is always checked (unless its own key id was guessed at from the same address), so a caller
    guessing keys from a shared address never locks out the tenants behind it."""

    def __init__(self, max_per_minute: int) -> None:
        self.max_per_minute = max_per_minute
        self._pairs = MinuteWindow()  # failures per 'address key_id' of an existing key id
        self._unknown = MinuteWindow()  # failures per address with a key id that does not exist

    def authenticate(self, store: Store, api_key: str | None, address: str) -> Tenant:
        """`authenticate`, throttled as the class says; a failure is counted before its 401 goes out."""
        parts = split_key(api_key)
        key_id, row = parts[0] if parts else None, None
        if key_id is not None:
            self._pairs.admit(
                f'{address} {key_id}',
                self.max_per_minute,
                f'too many failed logins from {address} with key id {key_id}',
                record=False,
            )
            row = store.api_key(key_id)
        if row is None:
            self._unknown.admit(address, self.max_per_minute, f'too many failed logins from {address}', record=False)
        try:
            return _verify(parts, row)
        except ApiError:
            if row is None:
                self._unknown.record(address)
            else:
                self._pairs.record(f'{address} {key_id}')
            raise

    def reset(self) -> None:
        self._pairs.reset()
        self._unknown.reset()
