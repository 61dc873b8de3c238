"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with OpenAI's status codes.

`OpenAIError` is an `ApiError`, so the app's handler answers it with the body below and the usual headers
(`x-should-retry: false` unless waiting helps, `Retry-After` on a 429). `as_openai_error` turns any error raised
while serving an OpenAI route (the service's own `ApiError`s included) into one.
"""

from __future__ import annotations

from typing import Any

from twinkle_server.errors import ApiError

#: OpenAI's error `type` by status (a status not listed: by class, 4xx -> invalid_request_error)
ERROR_TYPES: dict[int, str] = {
    400: 'invalid_request_error',
    401: 'invalid_request_error',
    403: 'permission_error',
    404: 'invalid_request_error',
    405: 'invalid_request_error',
    408: 'timeout_error',
    409: 'conflict_error',
    413: 'invalid_request_error',
    429: 'rate_limit_error',
}
#: the `code` when none is given (OpenAI's own codes where it has one)
DEFAULT_CODES: dict[int, str] = {401: 'invalid_api_key', 404: 'not_found', 429: 'rate_limit_exceeded'}


class OpenAIError(ApiError):
    """An error of the OpenAI-compatible routes. `param`: the request field at fault; `code`: a machine-readable
    reason (``model_not_found``, ``context_length_exceeded``, ...)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(status, message, retry_after_s=retry_after_s)
        self.param = param
        self.code = code if code is not None else DEFAULT_CODES.get(status)

    def __reduce__(self):  # keep param and code when pickled
        return (_rebuild, (self.status, self.message, self.param, self.code, self.retry_after_s))

    @property
    def error_type(self) -> str:
        if self.status in ERROR_TYPES:
            return ERROR_TYPES[self.status]
        return 'server_error' if self.status >= 500 else 'invalid_request_error'

    def body(self) -> dict[str, Any]:
        return {'error': {'message': self.message, 'type': self.error_type, 'param': self.param, 'code': self.code}}


def _rebuild(status: int, message: str, param: str | None, code: str | None, retry: float | None) -> OpenAIError:
    return OpenAIError(status, message, param=param, code=code, retry_after_s=retry)


def invalid(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    """A 400 for a request field the server cannot serve."""
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f'The model {model!r} does not exist or you do not have access to it (GET /v1/models lists the base models '
        f'and your sampler checkpoints).',
        param='model',
        code='model_not_found',
    )


def as_openai_error(exc: BaseException) -> OpenAIError:
    """The OpenAI-shaped answer for `exc`. The service's 422s (a setting it cannot serve) are 400s here: OpenAI
    answers every invalid request with 400. A 401 says how an OpenAI client sends its key."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, ApiError):
        status = 400 if exc.status == 422 else exc.status
        message = exc.message
        if status == 401:
            message = (
                'Missing or invalid API key: send a key issued by `twinkle server keys create --tenant NAME` as '
                '`Authorization: Bearer <key>` (the OpenAI client sends its api_key so).'
            )
        return OpenAIError(status, message, retry_after_s=exc.retry_after_s)
    return OpenAIError(500, f'internal error: {type(exc).__name__}: {exc}')


def unrouted(method: str, path: str, status: int, detail: str) -> OpenAIError:
    """The answer for a path under /v1 that no route serves (404), or a method its route does not take (405)."""
    if status == 404:
        return OpenAIError(
            404,
            f'no route {method} {path}; this server answers GET /v1/models, GET /v1/models/{{model}}, '
            f'POST /v1/chat/completions and POST /v1/completions',
            code='unknown_url',
        )
    if status == 405:
        return OpenAIError(405, f'{method} is not allowed on {path}', code='method_not_allowed')
    return OpenAIError(status, detail)


def from_failure(body: dict[str, Any]) -> OpenAIError:
    """The error of a queued request that failed (its future's body: `error`, `category`, `status`)."""
    status = body.get('status')
    if not isinstance(status, int):
        status = 500 if body.get('category') == 'server' else 400
    return as_openai_error(ApiError(status, str(body.get('error') or 'the request failed')))
