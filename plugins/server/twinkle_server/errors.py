"""Errors a route or a queued request answers with: a status, a message saying what to fix, a category.

The Tinker SDK retries 408/409/429/5xx for minutes, so every deterministic failure must be a 4xx with a JSON
body (`{"error": ..., "category": "user"}`); never 402, never an empty 400.
"""
from __future__ import annotations

from typing import Any, Literal

Category = Literal['user', 'server', 'unknown']


class ApiError(Exception):
    """A request that cannot be served. `status` 4xx = the caller's fault (not retried), 5xx = ours."""

    def __init__(self, status: int, message: str, category: Category | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.category: Category = category or ('user' if status < 500 else 'server')

    def body(self) -> dict[str, Any]:
        return {'error': self.message, 'category': self.category, 'detail': self.message}


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def not_found(what: str, ident: str) -> ApiError:
    return ApiError(404, f'{what} {ident!r} not found (ids are only visible to the tenant that created them).')


def unprocessable(message: str) -> ApiError:
    return ApiError(422, message)


def failure_body(exc: BaseException) -> dict[str, Any]:
    """The `retrieve_future` body of a request that failed while it ran."""
    if isinstance(exc, ApiError):
        return {'error': exc.message, 'category': exc.category}
    from twinkle_core.errors import TwinkleError
    if isinstance(exc, (TwinkleError, ValueError, KeyError, TypeError)):  # the caller's input or settings
        return {'error': f'{type(exc).__name__}: {exc}', 'category': 'user'}
    return {'error': f'internal error: {type(exc).__name__}: {exc}', 'category': 'server'}
