"""Structured logs: every record emitted while serving a request carries `request_id`, `tenant` and `model`.

- `RequestIdMiddleware` (ASGI) gives each HTTP request an id — the client's `X-Request-ID` when it is a sane token
  (`[A-Za-z0-9][A-Za-z0-9._:-]*`, at most 64 characters), else a fresh one — returns it in the `X-Request-ID`
  response header, holds it in a context variable while the request is handled, and writes one access line
  (logger `twinkle_server.access`; DEBUG for `/metrics` and health checks, INFO otherwise) when it is done.
- The context is one mutable `RequestContext` per request: the tenant and model are filled in (`annotate`) once a
  route learns them, which also reaches code running in the thread pool. Work queued to a model's worker thread
  takes a copy (`snapshot`), and the worker binds it (`bound`) while it runs that work, so engine logs carry the
  ids of the requests they serve (a batched engine call: the ids joined with `,`).
- `ContextFilter` copies the context onto every record; `JsonFormatter` writes one JSON object per line
  (`ts, level, logger, msg, request_id, tenant, model, thread`, plus `exc` with the traceback); `TextFormatter`
  appends the context to the usual line. `configure` installs them on the root logger (what `serve` calls).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import logging
import re
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Iterator

from twinkle_server.asgi import Message, Receive, Scope, Send

__all__ = [
    'ContextFilter',
    'JsonFormatter',
    'RequestContext',
    'RequestIdMiddleware',
    'TextFormatter',
    'annotate',
    'bound',
    'configure',
    'current',
    'merged',
    'snapshot',
]

LOG_FORMATS = ('text', 'json')
HEADER = b'x-request-id'
_SANE_ID = re.compile(r'[A-Za-z0-9][A-Za-z0-9._:-]{0,63}')
access_logger = logging.getLogger('twinkle_server.access')
QUIET_PATHS = frozenset({'/metrics', '/api/v1/healthz'})  # polled by monitors: access lines at DEBUG only


@dataclass
class RequestContext:
    """Who and what a log record is about. Mutable: `annotate` fills it in as a request is handled."""

    request_id: str | None = None
    tenant: str | None = None
    model: str | None = None


_CONTEXT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar('twinkle_request', default=None)


def current() -> RequestContext | None:
    """The context of the request being handled here, or None outside any request."""
    return _CONTEXT.get()


def annotate(**fields: str | None) -> None:
    """Set fields (`tenant`, `model`) of the current request's context; a no-op outside a request."""
    ctx = _CONTEXT.get()
    if ctx is not None:
        for name, value in fields.items():
            setattr(ctx, name, value)


def snapshot(**fields: str | None) -> RequestContext | None:
    """A copy of the current context (with `fields` set), for work handed to another thread; None outside a
    request."""
    ctx = _CONTEXT.get()
    return None if ctx is None else dataclasses.replace(ctx, **{k: v for k, v in fields.items() if v is not None})


def merged(contexts: list[RequestContext | None]) -> RequestContext | None:
    """One context for work serving several requests: each field's distinct values joined with `,`."""
    present = [c for c in contexts if c is not None]
    if len(present) <= 1:
        return present[0] if present else None

    def join(name: str) -> str | None:
        values = list(dict.fromkeys(v for c in present if (v := getattr(c, name)) is not None))
        return ','.join(values) if values else None

    return RequestContext(join('request_id'), join('tenant'), join('model'))


@contextlib.contextmanager
def bound(ctx: RequestContext | None) -> Iterator[None]:
    """Make `ctx` the current context for the block (e.g. in a worker thread running a request's work)."""
    token = _CONTEXT.set(ctx)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def request_id_from(value: str | None) -> str:
    """The client's id when it is a sane token of at most 64 characters, else a new one."""
    if value is not None and _SANE_ID.fullmatch(value):
        return value
    return uuid.uuid4().hex


# ---- logging --------------------------------------------------------------------------------------------------
class ContextFilter(logging.Filter):
    """Adds `request_id`, `tenant` and `model` (None when unknown) to every record. Install it on handlers: a
    logger's filters do not see records propagated from child loggers."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _CONTEXT.get()
        for name in ('request_id', 'tenant', 'model'):
            if not hasattr(record, name):
                setattr(record, name, getattr(ctx, name) if ctx is not None else None)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, msg, request_id, tenant, model, thread, and
    `exc` (the formatted traceback) when the record has exception info."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, Any] = {
            'ts': ts.strftime('%Y-%m-%dT%H:%M:%S.') + f'{ts.microsecond // 1000:03d}Z',
            'level': record.levelname,
            'logger': record.name,
            'msg': record.getMessage(),
            'request_id': getattr(record, 'request_id', None),
            'tenant': getattr(record, 'tenant', None),
            'model': getattr(record, 'model', None),
            'thread': record.threadName,
        }
        if record.exc_info:
            out['exc'] = self.formatException(record.exc_info)
        if record.stack_info:
            out['stack'] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`<time> <LEVEL> <logger>: <message>`, then `[request_id=... tenant=... model=...]` for the fields known."""

    def __init__(self) -> None:
        super().__init__('%(asctime)s %(levelname)s %(name)s: %(message)s')

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = [
            f'{name}={value}'
            for name in ('request_id', 'tenant', 'model')
            if (value := getattr(record, name, None)) is not None
        ]
        if not fields:
            return text
        line, sep, rest = text.partition('\n')  # keep a traceback below the line it belongs to
        return f'{line} [{" ".join(fields)}]{sep}{rest}'


def configure(log_format: str = 'text', level: int = logging.INFO) -> None:
    """The process's logging: one stderr handler on the root logger (replacing any), with the context filter and
    the chosen formatter; uvicorn's loggers propagate to it. Raises ValueError for an unknown format."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f'log format must be one of {LOG_FORMATS}, got {log_format!r}')
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if log_format == 'json' else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ('uvicorn', 'uvicorn.error', 'uvicorn.access'):
        logging.getLogger(name).handlers = []
        logging.getLogger(name).propagate = True


# ---- the HTTP side --------------------------------------------------------------------------------------------


class RequestIdMiddleware:
    """ASGI middleware (outermost): request id in, context set, `X-Request-ID` out, one access line per request."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope['type'] != 'http':
            await self.app(scope, receive, send)
            return
        incoming = next((v.decode('latin-1') for k, v in scope.get('headers', ()) if k.lower() == HEADER), None)
        ctx = RequestContext(request_id_from(incoming))
        status, start = 500, time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message['type'] == 'http.response.start':
                status = message['status']
                headers = [(k, v) for k, v in message.get('headers', ()) if k.lower() != HEADER]
                message = {**message, 'headers': [*headers, (HEADER, (ctx.request_id or '').encode())]}
            await send(message)

        token = _CONTEXT.set(ctx)
        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            # the context stays set: Starlette's outermost error handler (app.py) logs and answers with this id
            self._access(scope, status, start)
            raise
        self._access(scope, status, start)
        _CONTEXT.reset(token)

    @staticmethod
    def _access(scope: Scope, status: int, start: float) -> None:
        path = scope.get('path', '')
        access_logger.log(
            logging.DEBUG if path in QUIET_PATHS else logging.INFO,
            '%s %s %d %.1f ms',
            scope.get('method'),
            path,
            status,
            (time.perf_counter() - start) * 1000,
        )
