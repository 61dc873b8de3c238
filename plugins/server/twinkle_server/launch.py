"""Run the server: in the foreground (`serve`, what `twinkle server start` calls) or in a background thread
(`start_in_thread`, for tests, benchmarks and notebooks)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from twinkle_server.app import create_app
from twinkle_server.config import ServerConfig
from twinkle_server.engine import Engine

__all__ = ['RunningServer', 'create_app', 'free_port', 'serve', 'start_in_thread', 'start_process']


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


def start_process(models: dict[str, str], data_dir: str, port: int, *, extra_args: tuple[str, ...] = (),
                  env: dict[str, str] | None = None, timeout_s: float = 120.0) -> subprocess.Popen:
    """Run `twinkle server start` as a subprocess on 127.0.0.1:`port` and wait until /api/v1/healthz answers.

    `models` maps public names to model dirs. Raises RuntimeError (with the tail of the server's stderr) if the
    process exits or does not come up within `timeout_s`; the caller owns the returned process.
    """
    cmd = [sys.executable, '-m', 'twinkle_core.cli.main', 'server', 'start', '--data-dir', str(data_dir),
           '--port', str(port), *extra_args]
    for name, path in models.items():
        cmd += ['--model', f'{name}={path}']
    log = tempfile.TemporaryFile()  # not a pipe: a long-running server must never block on a full pipe
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **(env or {})})
    url, deadline = f'http://127.0.0.1:{port}/api/v1/healthz', time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f'twinkle server exited with {proc.returncode}: {log.read().decode()[-2000:]}')
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return proc
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f'twinkle server did not answer on port {port} within {timeout_s:.0f} s')
