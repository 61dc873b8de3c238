"""The HTTP connection to a twinkle server (httpx; API key in `X-API-Key`)."""

from __future__ import annotations

from typing import Any

import httpx

from twinkle_core.errors import InvalidInputError, TwinkleError


class RemoteError(TwinkleError):
    """The server refused or failed a call. `status` is the HTTP status; the message is the server's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f'server answered {status}: {message}')
        self.status = status


class RemoteInputError(RemoteError, InvalidInputError):
    """A 4xx: the request was wrong (bad rows, unknown names, another tenant's id...)."""


class Connection:
    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 600.0) -> None:
        if not api_key.startswith('tml-'):
            raise InvalidInputError('api_key must be a key issued by `twinkle server keys create` (starts with tml-)')
        self.base_url = base_url.rstrip('/')
        self._http = httpx.Client(base_url=self.base_url, headers={'X-API-Key': api_key}, timeout=timeout_s)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._check(self._http.post(path, json=body or {}))

    def get(self, path: str, **params: Any) -> Any:
        return self._check(self._http.get(path, params=params))

    def delete(self, path: str) -> Any:
        return self._check(self._http.delete(path))

    def close(self) -> None:
        self._http.close()

    @staticmethod
    def _check(r: httpx.Response) -> Any:
        if r.status_code >= 400:
            try:
                message = r.json().get('error', r.text)
            except ValueError:
                message = r.text
            if isinstance(message, dict):  # the OpenAI-shaped errors of the /v1 routes
                message = message.get('message', message)
            raise (RemoteInputError if r.status_code < 500 else RemoteError)(r.status_code, message)
        return r.json()
