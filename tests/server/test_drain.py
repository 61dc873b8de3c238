"""Graceful drain on SIGTERM/SIGINT: in-process with a scripted engine (exact outcomes; the signal handler, a
second signal) and for real: a `serve()` subprocess gets SIGTERM with forward/backward work queued; new work is
answered 503, accepted work finishes or fails with the shutdown message (read back from a restarted server on the
same data dir), and the process exits within the drain timeout.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import raw_http
from server_names import MODEL
from test_operations import _scrape

from twinkle_server.engine.model_host.base import ModelHost
from twinkle_server.service.drain import SHUTDOWN_QUEUED, SHUTDOWN_RUNNING


# ---- the drain ----------------------------------------------------------------------------------------------------
class ScriptedEngine(ModelHost):
    """No model: adapters are names, an optimizer step sleeps `STEP_S`; enough for queueing and shutdown paths."""

    base_model, model_dir, max_context_length = 'scripted', '.', 128
    STEP_S = 0.4

    def add_adapter(self, adapter, lora): ...
    def remove_adapter(self, adapter): ...
    def has_adapter(self, adapter):
        return False

    def forward_backward(self, batches):
        raise NotImplementedError

    def optim_step(self, adapter, step):
        return time.sleep(self.STEP_S) or {}

    def save_state(self, adapter, directory, *, optimizer): ...
    def load_state(self, adapter, directory, *, optimizer): ...
    def sample(self, jobs):
        raise NotImplementedError

    def native_call(self, adapter, method, args, kwargs):
        raise NotImplementedError


def _futures(data_dir, tenant: str, ids: list[str]) -> list[tuple[str, Any]]:
    """(state, JSON body) of each future, read from the store of a stopped server; none may be pending."""
    from twinkle_server.store import Store

    store = Store.open(None, str(data_dir))
    try:
        rows = [store.future(rid, tenant) for rid in ids]
    finally:
        store.close()
    assert all(row is not None and row.state != 'pending' for row in rows), rows
    return [(row.state, json.loads(row.body)) for row in rows]


def test_drain_finishes_accepted_work_and_fails_the_rest_clearly(tmp_path):
    from twinkle_server import ServerConfig
    from twinkle_server.launch import free_port, start_in_thread

    config = ServerConfig(models={'scripted': '.'}, data_dir=str(tmp_path), port=free_port(), drain_timeout_s=1.5)
    running = start_in_thread(config, hosts={'scripted': ScriptedEngine()})
    svc, gate = running.service, threading.Event()
    loop = svc.futures.loop

    def on_loop(fn):
        async def call():
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout=10)

    quick = [
        on_loop(lambda: svc.enqueue('t', 'scripted', call=lambda e: time.sleep(0.05) or 'ok', op='quick'))
        for _ in range(3)
    ]
    stuck = on_loop(lambda: svc.enqueue('t', 'scripted', call=lambda e: gate.wait(30), op='stuck'))
    behind = on_loop(lambda: svc.enqueue('t', 'scripted', call=lambda e: 'never', op='behind'))
    on_loop(lambda: svc.workers['scripted'].start_sequence('m', 1))  # seq_id 1 never comes: 2 waits in vain
    parked = on_loop(lambda: svc.enqueue('t', 'scripted', call=lambda e: 'never', model_id='m', seq_id=2))

    start = time.monotonic()
    with httpx.Client(base_url=running.base_url, timeout=10) as http:
        thread = threading.Thread(target=running.drain)
        thread.start()
        deadline = time.monotonic() + 5
        while not svc.drain.draining and time.monotonic() < deadline:
            time.sleep(0.01)
        refused = http.post('/api/v1/create_session', json={})
        assert refused.status_code == 503 and 'draining' in refused.json()['error'], refused.text
        assert int(refused.headers['retry-after']) >= 1
        assert http.get('/api/v1/healthz').status_code == 503
        assert http.get('/metrics').status_code == 200
        thread.join(timeout=30)
    elapsed = time.monotonic() - start
    gate.set()
    assert not running.thread.is_alive()
    assert 1.4 < elapsed < 1.5 + 4, elapsed  # the drain timeout, then a short wait for the stuck call

    rows = _futures(tmp_path, 't', [*quick, stuck, behind, parked])
    assert rows[:3] == [('done', 'ok')] * 3
    assert rows[3] == ('failed', {'error': SHUTDOWN_RUNNING, 'category': 'server', 'status': 503})
    assert rows[4] == rows[5] == ('failed', {'error': SHUTDOWN_QUEUED, 'category': 'server', 'status': 503})


def test_a_signal_drains_and_a_second_one_stops_at_once(tmp_path):
    """`DrainingServer` (what `serve` runs) in a thread, its signal handler called as the signal would call it."""
    import uvicorn

    from twinkle_server import ServerConfig, create_app
    from twinkle_server.launch import DrainingServer, free_port

    config = ServerConfig(models={'scripted': '.'}, data_dir=str(tmp_path), port=free_port(), drain_timeout_s=60)
    app = create_app(config, hosts={'scripted': ScriptedEngine()})
    server = DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, log_level='warning'), app)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.02)
    svc, gate = app.state.service, threading.Event()
    stuck = asyncio.run_coroutine_threadsafe(_enqueue(svc, lambda e: gate.wait(30)), svc.futures.loop).result(10)

    server.handle_exit(signal.SIGINT, None)
    time.sleep(0.5)
    assert svc.drain.draining and not server.should_exit  # draining: it waits for the stuck call
    start = time.monotonic()
    server.handle_exit(signal.SIGINT, None)  # the second signal: shut down now
    thread.join(timeout=30)
    gate.set()
    assert not thread.is_alive() and time.monotonic() - start < 5
    assert _futures(tmp_path, 't', [stuck]) == [
        ('failed', {'error': SHUTDOWN_RUNNING, 'category': 'server', 'status': 503})
    ]


async def _enqueue(svc, fn) -> str:
    return svc.enqueue('t', 'scripted', call=fn)


LAUNCH = """
import sys
from twinkle_server.config import ServerConfig
from twinkle_server.launch import serve
name, model_dir, data_dir, port, drain_s = sys.argv[1:]
if model_dir == 'scripted':  # no model to load: the engine of this test module
    import twinkle_server.app
    sys.path.insert(0, %r)
    from test_drain import ScriptedEngine
    twinkle_server.app.build_model_hosts = lambda config, device=None: {name: ScriptedEngine()}
serve(ServerConfig(models={name: model_dir}, data_dir=data_dir, port=int(port), drain_timeout_s=float(drain_s),
                   log_format='json'))
""" % str(Path(__file__).parent)


def _launch(model_dir, data_dir, port: int, drain_s: float, name: str = MODEL) -> tuple[subprocess.Popen, Any]:
    """`serve()` in a subprocess (JSON logs into the returned temporary file), once it answers health checks.
    `model_dir='scripted'` serves a `ScriptedEngine` instead of loading a model."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, '-c', LAUNCH, name, str(model_dir), str(data_dir), str(port), str(drain_s)],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, _tail(log)
        try:
            with urllib.request.urlopen(f'http://127.0.0.1:{port}/api/v1/healthz', timeout=1):
                return proc, log
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f'server did not start: {_tail(log)}')


def _tail(log) -> str:
    log.seek(0)
    return log.read().decode(errors='replace')[-3000:]


def _key(data_dir, tenant: str) -> str:
    from twinkle_server.service.auth import create_api_key
    from twinkle_server.store import Store

    store = Store.open(None, str(data_dir))
    try:
        return create_api_key(store, tenant)
    finally:
        store.close()


def test_sigterm_drains_then_exits_and_a_restarted_server_answers_every_future(tmp_path, tiny_model_dir):
    from twinkle_server import ServerConfig
    from twinkle_server.launch import free_port, start_in_thread

    key = _key(tmp_path, 'dana')
    drain_s, port = 3.0, free_port()
    url = f'http://127.0.0.1:{port}'
    proc, log = _launch(tiny_model_dir, tmp_path, port, drain_s)
    try:
        with httpx.Client(base_url=f'{url}/api/v1', headers={'X-API-Key': key}, timeout=60) as http:
            _, model_id = raw_http.new_model(http, MODEL)

            def post(seq: int) -> str:
                body = raw_http.fwdbwd_body(model_id, seq, [raw_http.datum(128)] * 4)
                r = http.post('/forward_backward', content=body, headers=raw_http.PROTO)
                assert r.status_code == 200, r.text
                return r.json()['request_id']

            ids = [post(1)]
            assert isinstance(raw_http.result(http, ids[0]), bytes)  # the first step also warms up: not timed
            start = time.monotonic()
            ids.append(post(2))
            assert isinstance(raw_http.result(http, ids[1]), bytes)
            step_s = time.monotonic() - start  # this machine's pace: queue about 5 drains' worth of work, at most
            ids += [post(seq) for seq in range(3, 3 + min(60, max(8, math.ceil(5 * drain_s / step_s))))]  # 64 pending
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            while _scrape(url)[0].get(('twinkle_draining', frozenset())) != 1:
                assert time.monotonic() - sent < 5, 'the drain did not start'
                time.sleep(0.05)
            refused = http.post('/create_session', json={'tags': [], 'user_metadata': None, 'sdk_version': 'raw'})
            assert refused.status_code == 503 and 'server is draining' in refused.json()['error'], refused.text
            assert int(refused.headers['retry-after']) >= 1 and refused.headers['x-request-id']
            assert http.get('/healthz').status_code == 503
            first = http.post('/retrieve_future', json={'request_id': ids[0]})  # results can still be collected
            assert first.status_code == 200 and 'protobuf' in first.headers['content-type'], first.text
        proc.wait(timeout=drain_s + 30)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -signal.SIGTERM), _tail(log)
    assert elapsed < drain_s + 4, (elapsed, _tail(log))
    log.seek(0)
    records = [json.loads(line) for line in log.read().decode().splitlines() if line.startswith('{')]
    began = next(
        i for i, r in enumerate(records) if r['logger'] == 'twinkle_server.service.drain' and 'draining' in r['msg']
    )
    # accepted work went on running during the drain (engine lines, with the requests' ids, after it began)
    assert any(
        r['msg'].startswith('engine forward_backward') and r['request_id'] and r['tenant'] == 'dana'
        for r in records[began:]
    ), records[began:]

    # a restarted server on the same data dir (no model needed to answer futures)
    restarted = start_in_thread(
        ServerConfig(models={'scripted': '.'}, data_dir=str(tmp_path), port=free_port()),
        hosts={'scripted': ScriptedEngine()},
    )
    try:
        with httpx.Client(base_url=f'{restarted.base_url}/api/v1', headers={'X-API-Key': key}, timeout=60) as http:
            answers = [http.post('/retrieve_future', json={'request_id': rid}) for rid in ids]
    finally:
        restarted.stop()
    done = [a for a in answers if 'protobuf' in a.headers['content-type']]
    failed = [a.json() for a in answers if 'protobuf' not in a.headers['content-type']]
    assert all(f['error'] in (SHUTDOWN_QUEUED, SHUTDOWN_RUNNING) for f in failed), failed
    assert done and failed, (len(done), failed)


def test_cli_passes_the_log_format(monkeypatch, tmp_path, tiny_model_dir):
    import twinkle_server.launch
    from twinkle_core.cli.main import main

    calls = []
    monkeypatch.setattr(twinkle_server.launch, 'serve', lambda config, **kw: calls.append(config))
    argv = ['server', 'start', '--model', f'{MODEL}={tiny_model_dir}', '--data-dir', str(tmp_path)]
    assert main([*argv, '--log-format', 'json']) == 0 and main(argv) == 0
    assert [config.log_format for config in calls] == ['json', 'text']
    config_file = tmp_path / 'server.yaml'
    config_file.write_text(
        f'server: {{log_format: json}}\nstorage: {{data_dir: {tmp_path}}}\n'
        f'models: [{{name: m, path: {tiny_model_dir}}}]\n'
    )
    assert main(['server', 'start', '--config', str(config_file)]) == 0  # the file's key, the same declaration
    assert main(['server', 'start', '--config', str(config_file), '--log-format', 'text']) == 0
    assert [config.log_format for config in calls[2:]] == ['json', 'text']
