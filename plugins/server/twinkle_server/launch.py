"""Run the server: in the foreground (`serve`, what `twinkle server start` calls: drains on SIGTERM/SIGINT) or in a
background thread (`start_in_thread`, for tests, benchmarks and notebooks)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from twinkle_core.utils.net import free_port
from twinkle_server import logs
from twinkle_server.app import create_app
from twinkle_server.config import ServerConfig
from twinkle_server.engine.model_host import ModelHost

__all__ = ['DrainingServer', 'RunningServer', 'create_app', 'free_port', 'serve', 'start_in_thread', 'start_process']
#: after a drain, how long uvicorn waits for open responses before cancelling them (they all end at once: every
#: future has its answer by then)
GRACEFUL_CLOSE_S = 3
STARTUP_FAILURE = 3  # uvicorn's exit code when the app could not start


def serve(config: ServerConfig, device: str | None = None) -> None:
    """Serve in the foreground until SIGTERM or SIGINT, then drain (`service/drain.py`: at most
    `config.drain_timeout_s`) and return. Logs go to stderr as `config.log_format` ('text' or 'json': one JSON object
    per line, `logs.py`).

    SIGTERM ends the process with that signal once the shutdown is done (uvicorn's behaviour). When a host call
    outlived the drain (its request was already failed), the process exits at once (`os._exit(0)`): the interpreter
    cannot shut down torch under a running call."""
    logs.configure(config.log_format)
    app = create_app(config, device=device)
    server = DrainingServer(
        uvicorn_config(
            app, config, log_level='info', log_config=None, access_log=False, timeout_graceful_shutdown=GRACEFUL_CLOSE_S
        ),
        app,
    )
    try:
        server.run()
    except KeyboardInterrupt:  # SIGINT is re-raised once the drain and shutdown are done
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)
    service = getattr(app.state, 'service', None)
    if service is not None and any(w.running() for w in service.workers.values()):
        logging.getLogger(__name__).warning('exiting while an engine call still runs (its request was failed)')
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def uvicorn_config(app: FastAPI, config: ServerConfig, **options: Any) -> uvicorn.Config:
    """uvicorn's settings for `config`. `X-Forwarded-For` sets the client address (which the failed-login throttle
    counts by) only on a connection from one of `config.trusted_proxies`: uvicorn's own default trusts 127.0.0.1,
    which would let any local caller pick a fresh address for every guess."""
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        timeout_keep_alive=75,
        proxy_headers=bool(config.trusted_proxies),
        forwarded_allow_ips=list(config.trusted_proxies),
        **options,
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's server, except that the first SIGTERM/SIGINT drains the service before uvicorn's own shutdown
    starts. A second signal starts that shutdown at once (the app's shutdown then fails whatever is left)."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app
        self._drain_requested = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        service = getattr(self._app.state, 'service', None)
        if service is None or self._drain_requested or self.should_exit:  # not started yet, or a second signal
            super().handle_exit(sig, frame)
            return
        self._drain_requested = True  # a signal handler: no logging here (the drain logs as it starts)
        service.futures.loop.call_soon_threadsafe(
            service.drain.start, lambda: super(DrainingServer, self).handle_exit(sig, None)
        )


@dataclass
class RunningServer:
    base_url: str
    server: Any
    thread: threading.Thread

    @property
    def service(self) -> Any:
        return self.server.config.app.state.service

    def stop(self) -> None:
        """Stop at once: queued work is failed, the running host call may finish (up to 10 s)."""
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def drain(self, timeout_s: float = 300.0) -> None:
        """Drain as on SIGTERM (no new work; accepted work finishes within `drain_timeout_s` or is failed), then
        stop; returns when the server thread has ended (or after `timeout_s`)."""
        service = self.service
        service.futures.loop.call_soon_threadsafe(
            service.drain.start, lambda: setattr(self.server, 'should_exit', True)
        )
        self.thread.join(timeout=timeout_s)


def start_in_thread(
    config: ServerConfig, hosts: dict[str, ModelHost] | None = None, device: str | None = None, timeout_s: float = 120.0
) -> RunningServer:
    """Start uvicorn on `config.host:config.port` in a daemon thread and wait until it serves requests (`hosts`:
    ready model hosts, e.g. one shared across tests; by default they are built from `config`)."""
    app = create_app(config, hosts=hosts, device=device)
    server = uvicorn.Server(uvicorn_config(app, config, log_level='warning'))
    thread = threading.Thread(target=server.run, name='twinkle-server', daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f'twinkle server did not start on {config.host}:{config.port}')
        time.sleep(0.05)
    return RunningServer(f'http://{config.host}:{config.port}', server, thread)


def start_process(
    models: dict[str, str],
    data_dir: str,
    port: int,
    *,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
) -> subprocess.Popen:
    """Run `twinkle server start` as a subprocess on 127.0.0.1:`port` and wait until /api/v1/healthz answers.

    `models` maps public names to model dirs. Raises RuntimeError (with the tail of the server's stderr) if the
    process exits or does not come up within `timeout_s`; the caller owns the returned process.
    """
    cmd = [
        sys.executable,
        '-m',
        'twinkle_core.cli.main',
        'server',
        'start',
        '--data-dir',
        str(data_dir),
        '--port',
        str(port),
        *extra_args,
    ]
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
