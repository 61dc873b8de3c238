"""Console sign-in: the API key in an HttpOnly, SameSite=Strict cookie, and the CSRF tokens that go with it.

The cookie holds the key itself and every console request authenticates it as the API does (`auth.LoginThrottle`:
failed attempts are throttled the same way, a revoked key signs the browser out at its next request). Nothing is
kept server-side, so every server sharing a PostgreSQL database (or fronting a Ray deployment) serves any request.
The key is never put in a URL, a page or local storage, and never logged.

CSRF: a signed-in page carries ``HMAC(store secret, key id)`` (in a meta tag and the sign-out form); every
state-changing request must send it back (`X-CSRF-Token` header, or the form's ``csrf_token`` field). The sign-in
form itself carries a random token that must match a short-lived cookie of its own (double submit)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request, Response

from twinkle_server.errors import ApiError
from twinkle_server.service.auth import Tenant
from twinkle_server.service.core import Service

__all__ = [
    'BASE',
    'COOKIE',
    'CSRF_FIELD',
    'ConsoleUser',
    'check_csrf',
    'clear_session',
    'login_csrf_ok',
    'new_login_token',
    'set_login_cookie',
    'set_session',
    'signed_in',
]

BASE = '/console'
COOKIE = 'twinkle_console'
LOGIN_COOKIE = 'twinkle_console_login'
CSRF_FIELD = 'csrf_token'
CSRF_HEADER = 'x-csrf-token'
SESSION_MAX_AGE_S = 12 * 3600


@dataclass(frozen=True)
class ConsoleUser:
    """The signed-in tenant, whether its key is an operator's, and its CSRF token."""

    tenant: Tenant
    admin: bool
    csrf: str


def _csrf_for(svc: Service, key_id: str) -> str:
    secret = bytes.fromhex(svc.store.setting('console_csrf_secret', secrets.token_hex(32)))
    return hmac.new(secret, f'console csrf {key_id}'.encode(), hashlib.sha256).hexdigest()


def signed_in(request: Request) -> ConsoleUser | None:
    """The console user of `request` (its cookie's key, authenticated and throttled like an API key), or None."""
    key = request.cookies.get(COOKIE)
    if not key:
        return None
    svc: Service = request.app.state.service
    address = request.client.host if request.client else 'unknown'
    try:
        who = svc.logins.authenticate(svc.store, key, address)
    except ApiError:
        return None
    request.state.tenant = who.name
    return ConsoleUser(who, svc.store.is_admin_key(who.key_id), _csrf_for(svc, who.key_id))


def check_csrf(request: Request, user: ConsoleUser, form_value: str | None = None) -> None:
    """403 unless the request sends `user`'s CSRF token (header, or `form_value` from a posted form)."""
    given = form_value if form_value is not None else request.headers.get(CSRF_HEADER, '')
    if not given or not hmac.compare_digest(given.encode('utf-8', 'replace'), user.csrf.encode()):
        raise ApiError(403, 'missing or invalid CSRF token: reload the console page and try again', category='user')


def new_login_token() -> str:
    """A fresh token for one sign-in form (`set_login_cookie` sends its cookie twin)."""
    return secrets.token_urlsafe(24)


def set_login_cookie(request: Request, response: Response, token: str) -> None:
    response.set_cookie(
        LOGIN_COOKIE, token, max_age=3600, httponly=True, samesite='strict', secure=_https(request), path=BASE
    )


def login_csrf_ok(request: Request, form_value: str) -> bool:
    cookie = request.cookies.get(LOGIN_COOKIE, '')
    return bool(cookie) and hmac.compare_digest(cookie.encode(), form_value.encode('utf-8', 'replace'))


def set_session(request: Request, response: Response, api_key: str) -> None:
    response.set_cookie(
        COOKIE,
        api_key,
        max_age=SESSION_MAX_AGE_S,
        httponly=True,
        samesite='strict',
        secure=_https(request),
        path=BASE,
    )
    response.delete_cookie(LOGIN_COOKIE, path=BASE)


def clear_session(response: Response) -> None:
    response.delete_cookie(COOKIE, path=BASE, httponly=True, samesite='strict')


def _https(request: Request) -> bool:
    return request.url.scheme == 'https'
