"""The ASGI types the server's middleware is written against (`logs`, `metrics`, `api/guard.py`,
`api/drain_gate.py`)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
