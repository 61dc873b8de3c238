"""`twinkle console --logdir DIR`: the console's run and curve pages over local JSONL metrics (`runs_jsonl`),
served by the standard library's HTTP server. Read-only: it answers GET (and HEAD) only, on 127.0.0.1 unless told
otherwise; nothing it serves changes anything, so it needs no sign-in and no CSRF token."""

from __future__ import annotations

import json
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from twinkle_core.console import runs_jsonl
from twinkle_core.console.pages import SECURITY_HEADERS, curves_panel, esc, page, runs_table, static_file

__all__ = ['LocalConsole', 'make_server']

BASE = '/console'
RUN_COLUMNS = (
    ('name', 'Run'),
    ('last_step', 'Last step'),
    ('points', 'Points'),
    ('updated', 'Updated'),
    ('status', 'Status'),
)


def runs_page(logdir: Path) -> str:
    body = (
        f'<p class="muted">Metrics files under <code>{esc(logdir)}</code>; tick runs to overlay their curves.</p>'
        f'{runs_table(RUN_COLUMNS)}{curves_panel()}'
    )
    return page(
        'Local runs',
        body,
        kind='runs',
        base=BASE,
        nav=[(BASE, 'Runs')],
        data={'runs-url': f'{BASE}/api/local/runs', 'metrics-url': f'{BASE}/api/local/metrics?run={{run}}'},
    )


class LocalConsole(BaseHTTPRequestHandler):
    """One request to the local console; `server.logdir` is the directory it reads."""

    server: _Server
    server_version = 'twinkle-console'

    def do_HEAD(self) -> None:  # noqa: N802 - the http.server naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        url = urlsplit(self.path)
        path = url.path.rstrip('/') or '/'
        logdir = self.server.logdir
        if path in ('/', BASE):
            self._send(HTTPStatus.OK, runs_page(logdir).encode(), 'text/html; charset=utf-8')
        elif path.startswith(f'{BASE}/static/'):
            found = static_file(path.removeprefix(f'{BASE}/static/'))
            if found is None:
                self._json(HTTPStatus.NOT_FOUND, {'error': f'no asset {path}'})
            else:
                self._send(HTTPStatus.OK, *found, cache=True)
        elif path == f'{BASE}/api/local/runs':
            runs = [runs_jsonl.summary(name, file) for name, file in runs_jsonl.find_runs(logdir).items()]
            runs.sort(key=lambda r: -(r['updated'] or 0))
            self._json(HTTPStatus.OK, {'runs': runs})
        elif path == f'{BASE}/api/local/metrics':
            name = parse_qs(url.query).get('run', [''])[0]
            file = runs_jsonl.run_file(logdir, name)
            if file is None:
                self._json(HTTPStatus.NOT_FOUND, {'error': f'no run {name!r} under {logdir}'})
            else:
                self._json(HTTPStatus.OK, {'run': name, 'series': runs_jsonl.read_series(file)})
        else:
            self._json(HTTPStatus.NOT_FOUND, {'error': f'no page {url.path}; the console is at {BASE}'})

    def _refuse(self) -> None:
        self._json(HTTPStatus.METHOD_NOT_ALLOWED, {'error': 'the local console is read-only: GET only'})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

    def _json(self, code: HTTPStatus, body: Any) -> None:
        self._send(code, json.dumps(body).encode(), 'application/json')

    def _send(self, code: HTTPStatus, body: bytes, kind: str, cache: bool = False) -> None:
        self.send_response(code)
        self.send_header('Content-Type', kind)
        self.send_header('Content-Length', str(len(body)))
        for name, value in SECURITY_HEADERS.items():
            if not (cache and name == 'Cache-Control'):
                self.send_header(name, value)
        self.end_headers()
        if self.command != 'HEAD':
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: the CLI prints the URL once
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    logdir: Path


def make_server(logdir: str | Path, host: str = '127.0.0.1', port: int = 0) -> ThreadingHTTPServer:
    """A server for the console over `logdir` (port 0: any free one); run it with `serve_forever()`."""
    server = _Server((host, port), LocalConsole)
    server.logdir = Path(logdir)
    return server
