"""`DrainGate`: the ASGI middleware of the graceful drain (`twinkle_server/service/drain.py`): while the service
serves, it counts the requests being handled; while it drains, it answers 503 to all but `EXEMPT_PATHS`."""

from __future__ import annotations

from typing import Any

from twinkle_server.api.guard import send_error
from twinkle_server.asgi import Receive, Scope, Send
from twinkle_server.service.drain import Drain

#: what a draining server still answers: collecting results, keeping sessions alive, monitoring
EXEMPT_PATHS = frozenset(
    {
        '/api/v1/retrieve_future',
        '/api/v1/retrieve_futures',  # a sampling client's completions (then fetched with retrieve_future)
        '/api/v1/session_heartbeat',
        '/api/v1/telemetry',
        '/metrics',
    }
)


class DrainGate:
    """ASGI middleware: while serving, counts admitted requests (`Drain.in_flight`); while draining, answers 503 to
    all but `EXEMPT_PATHS`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        service = getattr(scope['app'].state, 'service', None) if scope['type'] == 'http' else None
        if service is None or scope.get('path') in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        drain: Drain = service.drain
        if drain.draining:
            await send_error(send, drain.refusal())
            return
        drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            drain.in_flight -= 1
