"""Network helpers."""

from __future__ import annotations

import socket


def free_port(host: str = '127.0.0.1') -> int:
    """A TCP port that is free on `host` right now (``''``: every interface); the caller binds it soon after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
