"""Errors a route or a queued request answers with: a status, a message saying what to fix, a category.

The Tinker SDK retries 408/409/429/5xx for minutes, so every deterministic failure must be a 4xx with a JSON
body (`{"error": ..., "category": "user"}`) and `x-should-retry: false`; never 402, never an empty 400. Only
caps a client can wait out (429 with `Retry-After`) are retryable, and work that needs disk space the server
lacks (507 with `x-should-retry: true` and `Retry-After`: the operator frees space, the SDK's retry gets through).
"""

from __future__ import annotations

import errno
from typing import Any, Literal

from twinkle_core.errors import TwinkleError

Category = Literal['user', 'server', 'unknown']
PG_DISK_FULL = '53100'
SQLITE_FULL = 13
#: statuses the tinker SDK retries unless told otherwise
RETRYABLE_STATUSES = frozenset({408, 409, 429})
#: how long a client should wait before retrying work refused for lack of disk space
DISK_RETRY_AFTER_S = 10.0


class BacklogFull(OSError):
    """The disk is full and the metadata writes already waiting for space fill their bound (`db.writebehind`)."""

    def __init__(self, waiting: int) -> None:
        super().__init__(
            errno.ENOSPC,
            f'the disk is full and {waiting} metadata writes already wait in memory for '
            f'space; free disk space on the server',
        )


class ApiError(Exception):
    """A request that cannot be served. `status` 4xx = the caller's fault (not retried), 5xx = ours."""

    def __init__(
        self,
        status: int,
        message: str,
        category: Category | None = None,
        retry_after_s: float | None = None,
        retryable: bool | None = None,
    ) -> None:
        """`retryable`: say so explicitly (`x-should-retry`); None: decided by the status."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.category: Category = category or ('user' if status < 500 else 'server')
        self.retry_after_s = retry_after_s
        self.explicit_retry = retryable

    def __reduce__(self):  # keep status and category when pickled (errors cross Ray actor boundaries)
        return (type(self), (self.status, self.message, self.category, self.retry_after_s, self.explicit_retry))

    @property
    def retryable(self) -> bool:
        """Will (and should) a client send the same request again? 4xx other than 408/409/429: no."""
        if self.explicit_retry is not None:
            return self.explicit_retry
        return self.status >= 500 or self.status in RETRYABLE_STATUSES

    def headers(self) -> dict[str, str]:
        headers = {} if self.retryable else {'x-should-retry': 'false'}
        if self.explicit_retry:
            headers['x-should-retry'] = 'true'
        if self.retry_after_s is not None:
            headers['retry-after'] = str(max(1, int(round(self.retry_after_s))))
        return headers

    def body(self) -> dict[str, Any]:
        return {'error': self.message, 'category': self.category, 'detail': self.message, 'status': self.status}


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)


def not_found(what: str, ident: str) -> ApiError:
    return ApiError(404, f'{what} {ident!r} not found (ids are only visible to the tenant that created them).')


def unprocessable(message: str) -> ApiError:
    return ApiError(422, message)


def over_limit(name: str, value: int, asked: int | str, what: str, status: int = 413) -> ApiError:
    """A per-request cap (never retried: the same request would fail again). 413 for sizes, 400 for settings."""
    return ApiError(status, f'{what} ({asked}) exceeds the server limit {name}={value}')


def out_of_disk(what: str) -> ApiError:
    """507 for work that needs disk space the server lacks: retryable, since the operator can free space."""
    return ApiError(
        507,
        f'the server is out of disk space: {what}. Retry later (the tinker SDK retries by itself) '
        f'or delete old checkpoints.',
        category='server',
        retry_after_s=DISK_RETRY_AFTER_S,
        retryable=True,
    )


def is_disk_full(exc: BaseException) -> bool:
    """A write failed because the disk (or quota) is full: an OSError, torch's serializer message for it, SQLite's
    SQLITE_FULL or PostgreSQL's disk_full (SQLSTATE 53100)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if getattr(exc, 'sqlite_errorcode', None) == SQLITE_FULL or getattr(exc, 'sqlstate', None) == PG_DISK_FULL:
        return True
    text = str(exc)
    return 'No space left on device' in text or 'unexpected pos' in text or 'database or disk is full' in text


def as_api_error(exc: BaseException) -> ApiError:
    """The answer for an exception raised while a request ran (what its future reports)."""
    if isinstance(exc, ApiError):
        return exc
    if is_disk_full(exc):
        what = (
            str(exc.strerror or exc)
            if isinstance(exc, BacklogFull)
            else 'a write ran out of space; nothing was overwritten (the previous checkpoint of that name is intact)'
        )
        return out_of_disk(what)
    if isinstance(exc, (TwinkleError, ValueError, KeyError, TypeError)):  # the caller's input or settings
        return ApiError(422, f'{type(exc).__name__}: {exc}')
    return ApiError(500, f'internal error: {type(exc).__name__}: {exc}')


def failure_body(exc: BaseException) -> dict[str, Any]:
    """The `retrieve_future` body of a request that failed while it ran (`status`: what a route would answer)."""
    err = as_api_error(exc)
    return {'error': err.message, 'category': err.category, 'status': err.status}
