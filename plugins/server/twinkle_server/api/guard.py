"""ASGI middleware that keeps one client mistake from hurting anyone: the body limit, and seq_id release.

- **Body limit.** A declared `Content-Length` over `max_body_bytes` is answered 413 before the body is read; a
  chunked body is counted as it streams and refused (413) the moment it passes the limit, so nothing larger than
  the limit is ever buffered. The 413 goes out at once, then the rest of the body is read and discarded (at most
  `drain_budget(limit)` bytes within `DRAIN_S`, giving up after `DRAIN_IDLE_S` without a byte) before the
  connection closes: a client still sending (httpx, the tinker SDK) reads the 413 once its body is out, instead of
  a reset connection it would retry for minutes; a client that sent only the headers has its answer at once.
- **seq_id release.** A training model runs its requests strictly in `seq_id` order, so a request refused before
  its seq_id was queued (any non-retryable 4xx: bad JSON, a bad field, an over-limit body, ...) would leave a
  hole every later request of that model waits on. When such a refusal goes out, the guard reads
  `model_id`/`seq_id` from the first bytes of the body (JSON, or the `ForwardBackwardRequest` protobuf, whose
  fields 1 and 2 they are) and tells the service to skip that seq_id — only for the model's own tenant, so a
  stranger cannot skip someone else's work. Retryable refusals (408/409/429/5xx) keep the seq_id: the client
  sends the same request again. Whatever slips through is bounded by the scheduler's `seq_gap_timeout_s`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any

from twinkle_server.asgi import Message, Receive, Scope, Send
from twinkle_server.errors import RETRYABLE_STATUSES, ApiError
from twinkle_server.service.auth import authenticate, key_from_headers

logger = logging.getLogger(__name__)


PEEK_BYTES = 64 * 1024  # model_id and seq_id are always within the first bytes of a body
_JSON_MODEL = re.compile(rb'"model_id"\s*:\s*"([^"\\]{1,512})"')
_JSON_SEQ = re.compile(rb'"seq_id"\s*:\s*(\d{1,18})\b')
DRAIN_S = 30.0  # the longest an over-limit body is read (and discarded) after its 413
DRAIN_IDLE_S = 5.0  # ... or until no byte of it came for this long
MIN_DRAIN_BYTES = 64 * 1024 * 1024


def drain_budget(limit: int) -> int:
    """The most body bytes read from a request refused for its size: enough for anything the SDK sends."""
    return max(MIN_DRAIN_BYTES, 16 * limit)


class BodyTooLarge(ApiError):
    def __init__(self, size: int | str, limit: int) -> None:
        super().__init__(
            413,
            f'request body of {size} bytes exceeds the server limit of {limit} bytes '
            f'(--max-body-mb); send smaller batches (the tinker SDK splits forward_backward '
            f'into chunks)',
        )


class RequestGuard:
    """Wrap the app: `RequestGuard(app)`; reads the limit from the running service's config per request."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope['type'] != 'http':
            await self.app(scope, receive, send)
            return
        service = getattr(scope['app'].state, 'service', None)
        if service is None:  # not started yet
            await self.app(scope, receive, send)
            return
        body = _Body(receive, service.config.max_body_bytes)
        declared = _header(scope, b'content-length')
        if declared is not None and declared.isdigit() and int(declared) > body.limit:
            await _refuse_declared(service, scope, body, send, int(declared))
            return

        async def guarded_send(message: Message) -> None:
            if message['type'] == 'http.response.start':
                if _frees_seq_id(message['status']):
                    await body.peek()
                    _release(service, scope, body.prefix, scope.get('state', {}).get('tenant'))
                if body.over:  # (peek may have read past the limit)
                    message = _closing(message)
            elif message['type'] == 'http.response.body' and body.over and not message.get('more_body'):
                # the last body message of a refusal: drain the request before the response ends
                await send({**message, 'more_body': True})
                await body.drain()
                message = {'type': 'http.response.body', 'body': b''}
            await send(message)

        await self.app(scope, body.receive, guarded_send)


async def _refuse_declared(service: Any, scope: Scope, body: _Body, send: Send, declared: int) -> None:
    """Answer 413 before reading the body, then read it (bounded): its first bytes name the seq_id to free."""
    await send_error(send, BodyTooLarge(declared, body.limit), more_body=True)
    await body.drain(PEEK_BYTES)
    _release(service, scope, body.prefix, _tenant_from_key(service, scope))
    await body.drain()
    await send({'type': 'http.response.body', 'body': b''})


def _closing(start: Message) -> Message:
    """`start` (an `http.response.start`) with `connection: close`."""
    return {**start, 'headers': [*start.get('headers', ()), (b'connection', b'close')]}


class _Body:
    """The request body as the app reads it: counted against `limit`, its first PEEK_BYTES kept."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self._receive = receive
        self.limit = limit
        self.prefix = bytearray()
        self.size = 0
        self.complete = False
        self._drain_until: float | None = None  # when draining must stop (set by the first `drain`)

    @property
    def over(self) -> bool:
        return self.size > self.limit

    async def receive(self) -> Message:
        message = await self._receive()
        self._count(message)
        if self.over:
            raise BodyTooLarge(f'more than {self.limit}', self.limit)
        return message

    def _count(self, message: Message) -> None:
        if message['type'] == 'http.request':
            chunk = message.get('body', b'')
            self.size += len(chunk)
            if len(self.prefix) < PEEK_BYTES:
                self.prefix += chunk[: PEEK_BYTES - len(self.prefix)]
            self.complete = not message.get('more_body', False)
        elif message['type'] == 'http.disconnect':
            self.complete = True

    async def peek(self) -> None:
        """Read on (if the app has not) until PEEK_BYTES are known or the body ends."""
        while not self.complete and len(self.prefix) < PEEK_BYTES:
            try:
                await self.receive()
            except BodyTooLarge:
                return

    async def drain(self, upto: int | None = None) -> None:
        """Read and discard the body until `upto` bytes (None: all of it) came or it ended — within the drain
        bounds (`drain_budget`, `DRAIN_S`, `DRAIN_IDLE_S`; module docstring), past which it stops for good."""
        if self._drain_until is None:
            self._drain_until = time.monotonic() + DRAIN_S
        budget = drain_budget(self.limit)
        upto = budget if upto is None else min(upto, budget)
        while not self.complete and self.size < upto:
            wait = max(0.0, min(DRAIN_IDLE_S, self._drain_until - time.monotonic()))
            try:
                message = await asyncio.wait_for(self._receive(), wait)
            except TimeoutError:
                self._drain_until = 0.0  # a client that stalls once is not waited for again
                return
            self._count(message)


def _frees_seq_id(status: int) -> bool:
    return 400 <= status < 500 and status not in RETRYABLE_STATUSES


def _release(service: Any, scope: Scope, prefix: bytes | bytearray, tenant: str | None) -> None:
    if tenant is None or scope.get('method') != 'POST':
        return
    ref = sequence_ref(bytes(prefix), _header(scope, b'content-type') or '')
    if ref is not None:
        service.release_seq_id(tenant, *ref)


def sequence_ref(prefix: bytes, content_type: str) -> tuple[str, int] | None:
    """(model_id, seq_id) named in the first bytes of a request body, or None when it names none."""
    if 'protobuf' in content_type:
        return _protobuf_ref(prefix)
    try:  # a complete JSON body
        body = json.loads(prefix)
        if (
            isinstance(body, dict)
            and isinstance(body.get('model_id'), str)
            and isinstance(body.get('seq_id'), int)
            and not isinstance(body['seq_id'], bool)
        ):
            return body['model_id'], body['seq_id']
    except (ValueError, RecursionError):
        pass
    model, seq = _JSON_MODEL.search(prefix), _JSON_SEQ.search(prefix)  # a truncated or malformed one
    return (model.group(1).decode(), int(seq.group(1))) if model and seq else None


def _protobuf_ref(data: bytes) -> tuple[str, int] | None:
    """Fields 1 (model_id, string) and 2 (seq_id, varint) of a protobuf message prefix."""
    model_id, seq_id, pos = None, None, 0
    try:
        while pos < len(data) and (model_id is None or seq_id is None):
            tag, pos = _varint(data, pos)
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                value, pos = _varint(data, pos)
                if field == 2:
                    seq_id = value
            elif wire == 2:
                length, pos = _varint(data, pos)
                if field == 1 and pos + length <= len(data):
                    model_id = data[pos : pos + length].decode()
                pos += length
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                return None
    except (IndexError, UnicodeDecodeError):
        return None
    return (model_id, seq_id) if model_id and seq_id is not None else None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80 or shift > 63:
            return value, pos
        shift += 7


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get('headers', ()):
        if key.lower() == name:
            return value.decode('latin-1')
    return None


def _tenant_from_key(service: Any, scope: Scope) -> str | None:
    key = key_from_headers(_header(scope, b'x-api-key'), _header(scope, b'authorization'))
    try:
        return authenticate(service.store, key).name
    except ApiError:
        return None


async def send_error(send: Send, err: ApiError, *, more_body: bool = False) -> None:
    """Answer `err` directly (the project's JSON error body and headers) and close the connection. With
    `more_body` the response is complete for the client (its Content-Length) but open for the server, which
    ends it with an empty `http.response.body` once it has drained the request."""
    payload = json.dumps(err.body()).encode()
    headers = [
        (b'content-type', b'application/json'),
        (b'content-length', str(len(payload)).encode()),
        (b'connection', b'close'),
    ]
    headers += [(k.encode(), v.encode()) for k, v in err.headers().items()]
    await send({'type': 'http.response.start', 'status': err.status, 'headers': headers})
    await send({'type': 'http.response.body', 'body': payload, 'more_body': more_body})
