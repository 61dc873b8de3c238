"""Transport-level refusals a hostile (or merely large) client meets, seen through the client a user runs.

- An over-limit body is read to its end (bounded) before the connection closes, so every HTTP client, the tinker
  SDK included, reads the 413 instead of a broken connection it would retry for minutes; a declared
  Content-Length with no body behind it is answered at once.
- Failed logins are throttled per (client address, key id), with a separate cap per address on unknown key ids:
  someone else's guesses never lock out a valid key, and `X-Forwarded-For` counts only from a trusted proxy.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any, Callable, Iterator

import httpx
import pytest
import tinker
from bounded import within
from raw_http import PROTO, assert_refused, datum, fwdbwd_body
from server_names import MODEL

MIB = 1024 * 1024
LIMIT = 1 * MIB
BIG_TOKENS = 450_000  # one datum of ~6.9 MiB on the wire: far more than the socket buffers hold
THRESHOLD = 30  # the default max_failed_logins_per_minute


class Running:
    """A dedicated server (its own body limit, throttle and proxy settings) and a key of tenant `alice`."""

    def __init__(self, running: Any, key: str) -> None:
        self.running, self.key = running, key
        self.base_url: str = running.base_url
        self.host, self.port = running.server.config.host, running.server.config.port

    @property
    def service(self) -> Any:
        return self.running.service


def _start(tmp_path_factory, model_dir, **options: Any) -> Running:
    from twinkle_server import ServerConfig, TenantLimits, start_in_thread
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    limits = TenantLimits().merged({'max_sessions': 512, 'max_tokens_per_request': 10**6})
    config = ServerConfig(
        models={MODEL: str(model_dir)},
        data_dir=str(tmp_path_factory.mktemp('transport')),
        port=free_port(),
        default_limits=limits,
        **options,
    )
    running = start_in_thread(config)
    return Running(running, create_api_key(running.service.store, 'alice'))


@pytest.fixture(scope='module')
def small(tmp_path_factory, tiny_model_dir) -> Iterator[Running]:
    """max_body_bytes = 1 MiB, no trusted proxy."""
    server = _start(tmp_path_factory, tiny_model_dir, max_body_bytes=LIMIT)
    yield server
    server.running.stop()


@pytest.fixture()
def throttle(small) -> Iterator[Any]:
    small.service.logins.reset()
    yield small.service.logins
    small.service.logins.reset()


def _raw(server: Running, head: str, body: bytes = b'') -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=10)
    sock.sendall(head.encode() + body)
    return sock


def _read_response(sock: socket.socket, timeout_s: float) -> tuple[int, dict[str, str], dict]:
    """(status, headers, JSON body) of the one response on `sock`."""
    sock.settimeout(timeout_s)
    data = b''
    while b'\r\n\r\n' not in data:
        chunk = sock.recv(65536)
        assert chunk, f'connection closed before a response: {data!r}'
        data += chunk
    head, rest = data.split(b'\r\n\r\n', 1)
    lines = head.decode('latin-1').split('\r\n')
    headers = {k.lower(): v.strip() for k, v in (line.split(':', 1) for line in lines[1:])}
    while len(rest) < int(headers['content-length']):
        rest += sock.recv(65536)
    return int(lines[0].split()[1]), headers, json.loads(rest)


def _post_head(server: Running, length: int | None) -> str:
    size = f'Content-Length: {length}' if length is not None else 'Transfer-Encoding: chunked'
    return (
        f'POST /api/v1/forward_backward HTTP/1.1\r\nHost: {server.host}\r\nX-API-Key: {server.key}\r\n'
        f'Content-Type: application/x-protobuf\r\n{size}\r\n\r\n'
    )


# ---- an over-limit body: a 413 every client can read ---------------------------------------------------------------
def test_sdk_body_over_the_limit_is_a_413_not_a_retried_broken_connection(small):
    svc = tinker.ServiceClient(base_url=small.base_url, api_key=small.key)
    tc = svc.create_lora_training_client(base_model=MODEL, rank=2).result()
    t0 = time.monotonic()
    with pytest.raises(tinker.APIStatusError) as refused:
        within(20, lambda: tc.forward_backward([datum(BIG_TOKENS)], 'cross_entropy').result())
    assert refused.value.status_code == 413 and 'exceeds the server limit of 1048576 bytes' in str(refused.value)
    assert time.monotonic() - t0 < 20
    # its seq_id was freed: the same client's next call runs at once
    out = within(60, lambda: tc.forward_backward([datum()], 'cross_entropy').result())
    assert out.metrics['loss:sum'] > 0


def test_the_sdk_splits_a_batch_larger_than_the_body_limit_into_chunks_that_fit(small):
    """/client/config tells the SDK to chunk below --max-body-mb (its own default, 5 MB, ignores the limit): a
    batch of ~1.2 MiB in small datums runs under a 1 MiB limit instead of being refused."""
    svc = tinker.ServiceClient(base_url=small.base_url, api_key=small.key)
    tc = svc.create_lora_training_client(base_model=MODEL, rank=2).result()
    batch = [datum(1000, 5 + i) for i in range(80)]  # ~15 KiB each on the wire (token ids below the vocabulary)
    assert len(fwdbwd_body('m', 1, batch)) > 1.1 * LIMIT
    out = within(120, lambda: tc.forward(batch, 'cross_entropy').result())
    assert len(out.loss_fn_outputs) == len(batch)


@pytest.mark.parametrize('framing', ['content-length', 'chunked'])
def test_httpx_reads_the_413_of_a_large_body(small, framing):
    body = fwdbwd_body('sess-x:train:0', 1, [datum(BIG_TOKENS)])
    content = body if framing == 'content-length' else iter([body[i : i + MIB] for i in range(0, len(body), MIB)])
    with httpx.Client(base_url=small.base_url + '/api/v1', headers={'X-API-Key': small.key}, timeout=30) as http:
        assert_refused(http.post('/forward_backward', content=content, headers=PROTO), 413, 'exceeds the server limit')
        assert http.get('/healthz').status_code == 200  # the client's next request goes through


def test_raw_socket_sending_the_whole_large_body_reads_the_413(small):
    body = b'\0' * (8 * MIB)
    sock = _raw(small, _post_head(small, len(body)), body)  # sendall finishes: the server reads it all
    with sock:
        status, headers, error = _read_response(sock, 10)
    assert status == 413 and headers['x-should-retry'] == 'false' and error['category'] == 'user'


def test_a_declared_length_with_no_body_is_answered_at_once(small):
    t0 = time.monotonic()
    with _raw(small, _post_head(small, 100 * MIB)) as sock:  # headers only; the client waits for an answer
        status, headers, error = _read_response(sock, 5)
    assert time.monotonic() - t0 < 1.5
    assert status == 413 and headers['x-should-retry'] == 'false' and 'exceeds the server limit' in error['error']


def _send_until_closed(sock: socket.socket, chunk: bytes, pause_s: float, limit_s: float) -> int:
    """Send `chunk` (every `pause_s`) until the server has closed the connection; the bytes it took."""
    sent, deadline = 0, time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            sock.sendall(chunk)
        except OSError:
            return sent
        sent += len(chunk)
        time.sleep(pause_s)
    raise AssertionError(f'the server still reads the body after {limit_s} s')


def test_the_drain_stops_after_drain_s(small, monkeypatch):
    from twinkle_server.api import guard

    monkeypatch.setattr(guard, 'DRAIN_S', 2.0)
    with _raw(small, _post_head(small, None), b'%x\r\n%s\r\n' % (2 * MIB, b'\0' * (2 * MIB))) as sock:
        status, _, _ = _read_response(sock, 5)
        t0 = time.monotonic()
        _send_until_closed(sock, b'1\r\n\0\r\n', 0.2, 10)  # a body that trickles on forever
    assert status == 413 and time.monotonic() - t0 < 5


def test_the_drain_stops_after_its_byte_budget(small):
    from twinkle_server.api.guard import drain_budget

    budget = drain_budget(LIMIT)
    with _raw(small, _post_head(small, 10 * budget)) as sock:
        status, _, _ = _read_response(sock, 5)
        sent = _send_until_closed(sock, b'\0' * MIB, 0, 60)
    assert status == 413 and budget <= sent < 2 * budget


# ---- failed logins ---------------------------------------------------------------------------------------------------
def _bad_logins(server: Running, n: int, forwarded_for: Callable[[int], str] | None = None) -> list[int]:
    with httpx.Client(base_url=server.base_url + '/api/v1', timeout=30) as anon:
        return [
            anon.get(
                '/get_server_capabilities',
                headers={
                    'X-API-Key': f'tml-{i:012d}wrong',
                    **({'X-Forwarded-For': forwarded_for(i)} if forwarded_for else {}),
                },
            ).status_code
            for i in range(n)
        ]


def test_guesses_from_an_address_never_lock_out_a_valid_key(small, throttle):
    assert _bad_logins(small, 40) == [401] * THRESHOLD + [429] * 10
    t0 = time.monotonic()
    caps = within(
        10, lambda: tinker.RestClient(base_url=small.base_url, api_key=small.key).get_server_capabilities().result()
    )
    assert [m.model_name for m in caps.supported_models] == [MODEL] and time.monotonic() - t0 < 5
    # guessing the secret of a known key id is throttled per (address, key id)
    key_id = small.key[: 4 + 12]
    with httpx.Client(base_url=small.base_url + '/api/v1', timeout=30) as anon:
        codes = [
            anon.get('/get_server_capabilities', headers={'X-API-Key': key_id + f'guess{i}'}).status_code
            for i in range(THRESHOLD + 1)
        ]
        assert codes == [401] * THRESHOLD + [429]
        r = anon.get('/get_server_capabilities', headers={'X-API-Key': key_id + 'guess'})
        assert r.status_code == 429 and 'too many failed logins' in r.json()['error']
        assert int(r.headers['retry-after']) >= 1


def test_forwarded_for_from_an_untrusted_peer_does_not_reset_the_count(small, throttle):
    codes = _bad_logins(small, 40, forwarded_for=lambda i: f'10.0.{i // 250}.{i % 250 + 1}')
    assert codes == [401] * THRESHOLD + [429] * 10


@pytest.fixture(scope='module')
def behind_proxy(tmp_path_factory, tiny_model_dir) -> Iterator[Running]:
    """A server that trusts 127.0.0.1 as a reverse proxy."""
    server = _start(tmp_path_factory, tiny_model_dir, trusted_proxies=('127.0.0.1',))
    yield server
    server.running.stop()


def test_a_trusted_proxy_forwards_the_client_address(behind_proxy):
    assert _bad_logins(behind_proxy, THRESHOLD + 1, forwarded_for=lambda i: '203.0.113.7') == [401] * THRESHOLD + [429]
    # another client behind the same proxy is its own address
    assert _bad_logins(behind_proxy, 1, forwarded_for=lambda i: '203.0.113.8') == [401]
    with httpx.Client(base_url=behind_proxy.base_url + '/api/v1', timeout=30) as http:
        r = http.get(
            '/get_server_capabilities', headers={'X-API-Key': 'tml-000000000000wrong', 'X-Forwarded-For': '203.0.113.7'}
        )
        assert r.status_code == 429 and 'too many failed logins from 203.0.113.7' in r.json()['error']
        assert (
            http.get(
                '/get_server_capabilities', headers={'X-API-Key': behind_proxy.key, 'X-Forwarded-For': '203.0.113.7'}
            ).status_code
            == 200
        )


# ---- the option ------------------------------------------------------------------------------------------------------
def test_trusted_proxy_option_from_flags_and_file(tmp_path, tiny_model_dir):
    from twinkle_core.cli.main import build_parser
    from twinkle_server.cli import config_from_args
    from twinkle_server.config import ConfigError

    def args(*argv: str):
        return build_parser(['server', 'start', *argv]).parse_args(['server', 'start', *argv])

    base = ('--model', f'm={tiny_model_dir}', '--data-dir', str(tmp_path))
    assert config_from_args(args(*base)).trusted_proxies == ()
    config = config_from_args(args(*base, '--trusted-proxy', '10.0.0.1', '--trusted-proxy', '10.1.0.0/16'))
    assert config.trusted_proxies == ('10.0.0.1', '10.1.0.0/16')
    with pytest.raises(ValueError, match="trusted proxy 'proxy.example' is not an IP address or network"):
        config_from_args(args(*base, '--trusted-proxy', 'proxy.example'))
    path = tmp_path / 'server.yaml'
    path.write_text(
        f'server:\n  trusted_proxies: [127.0.0.1, "::1"]\nstorage:\n  data_dir: {tmp_path}/d\n'
        f'models:\n  - name: m\n    path: {tiny_model_dir}\n'
    )
    assert config_from_args(args('--config', str(path))).trusted_proxies == ('127.0.0.1', '::1')
    path.write_text(path.read_text().replace('[127.0.0.1, "::1"]', '[nope]'))
    with pytest.raises(ConfigError, match=r"server\.trusted_proxies\[0\]: not an IP address or network: 'nope'"):
        config_from_args(args('--config', str(path)))
