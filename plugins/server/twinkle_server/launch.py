"""Run the server: in the foreground (`serve`, what `twinkle server start` calls) or in a background thread
(`start_in_thread`, for tests, benchmarks and notebooks)."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from twinkle_server.app import create_app
from twinkle_server.config import ServerConfig
from twinkle_server.engine import Engine

__all__ = ['RunningServer', 'create_app', 'free_port', 'serve', 'start_in_thread']


def serve(config: ServerConfig, device: str | None = None) -> None:
    import uvicorn
    uvicorn.run(create_app(config, device=device), host=config.host, port=config.port,
                log_level='info', timeout_keep_alive=75)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    base_url: str
    server: Any
    thread: threading.Thread

    @property
    def service(self) -> Any:
        return self.server.config.app.state.service

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_in_thread(config: ServerConfig, engines: dict[str, Engine] | None = None, device: str | None = None,
                    timeout_s: float = 120.0) -> RunningServer:
    """Start uvicorn on `config.host:config.port` in a daemon thread and wait until it serves requests."""
    import uvicorn
    app = create_app(config, engines=engines, device=device)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level='warning',
                                           timeout_keep_alive=75))
    thread = threading.Thread(target=server.run, name='twinkle-server', daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f'twinkle server did not start on {config.host}:{config.port}')
        time.sleep(0.05)
    return RunningServer(f'http://{config.host}:{config.port}', server, thread)
