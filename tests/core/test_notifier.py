"""`initialize(notifier=...)` alerts a webhook when the job fails: generic JSON and DingTalk robot formats,
delivered over real HTTP to a receiver on 127.0.0.1; a job that dies of an uncaught exception alerts too."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import sys
import textwrap
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

import twinkle_core
from twinkle_core.hooks import emit_failure
from twinkle_core.hooks.notifier import WebhookNotifier, install_notifier


class Receiver:
    """An HTTP server on 127.0.0.1 recording every POST (path with query, JSON body)."""

    def __init__(self, status: int = 200) -> None:
        self.posts: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers['Content-Length']))
                outer.posts.append((self.path, json.loads(body)))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = HTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.server.server_port}/hook'
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def receiver():
    r = Receiver()
    yield r
    install_notifier(None)
    r.close()


def test_json_alert_for_a_failing_model_call_sent_once(receiver, tiny_model_dir):
    from twinkle_core.model import TransformersModel

    twinkle_core.initialize('local', notifier=receiver.url)
    model = TransformersModel(str(tiny_model_dir), device='cpu')
    with pytest.raises(Exception) as info:
        model.forward_backward(inputs=[{'input_ids': [1, 2, 10**7], 'labels': [-100, 2, 3]}])
    assert len(receiver.posts) == 1
    path, body = receiver.posts[0]
    assert path == '/hook' and body['event'] == 'twinkle_failure'
    assert body['error_type'] == type(info.value).__name__ and body['message'] == str(info.value)
    assert body['context']['stage'] == 'forward_backward' and body['context']['where'] == 'transformers'
    assert body['pid'] > 0
    emit_failure(info.value, {'where': 'again'})  # the same exception reported again: no second alert
    assert len(receiver.posts) == 1
    emit_failure(ValueError('another failure'), {'where': 'test', 'step': 7})
    assert receiver.posts[-1][1]['context'] == {'where': 'test', 'step': 7}


def test_dingtalk_alert_is_a_signed_markdown_message(receiver):
    twinkle_core.initialize(
        'local',
        notifier={
            'url': receiver.url + '?access_token=abc',
            'format': 'dingtalk',
            'secret': 'SECabc',
            'title': 'sft job',
        },
    )
    emit_failure(RuntimeError('loss is NaN'), {'adapter_name': 'alice'})
    path, body = receiver.posts[0]
    query = urllib.parse.parse_qs(urllib.parse.urlparse(path).query)
    assert query['access_token'] == ['abc']
    timestamp = query['timestamp'][0]
    expected = base64.b64encode(hmac.new(b'SECabc', f'{timestamp}\nSECabc'.encode(), hashlib.sha256).digest())
    assert query['sign'] == [expected.decode()]
    assert body['msgtype'] == 'markdown' and body['markdown']['title'] == 'sft job'
    text = body['markdown']['text']
    assert '**RuntimeError**: loss is NaN' in text and 'adapter_name: alice' in text


def test_uncaught_exception_ending_the_script_alerts_and_still_prints(receiver, tmp_path):
    script = tmp_path / 'job.py'
    script.write_text(
        textwrap.dedent(f"""
        import twinkle_core
        twinkle_core.initialize('local', notifier={receiver.url!r})
        raise RuntimeError('data file is corrupt')
    """)
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and 'RuntimeError: data file is corrupt' in run.stderr  # the usual traceback
    assert len(receiver.posts) == 1
    body = receiver.posts[0][1]
    assert body['message'] == 'data file is corrupt' and body['context']['where'] == 'uncaught'
    assert body['context']['at'].endswith('job.py:4')


def test_an_unreachable_or_failing_receiver_never_breaks_the_job(caplog):
    broken = Receiver(status=500)
    try:
        assert WebhookNotifier(broken.url).send(ValueError('x'), {}) is False
    finally:
        broken.close()
    down = WebhookNotifier(broken.url + '?access_token=secret-token', timeout_s=1.0)
    with caplog.at_level('WARNING', logger='twinkle.notifier'):
        assert down.send(ValueError('x'), {}) is False
    assert 'could not deliver' in caplog.text and 'secret-token' not in caplog.text


def test_bad_notifier_settings_say_what_is_wrong():
    with pytest.raises(ValueError, match='http'):
        WebhookNotifier('ftp://example.com/hook')
    with pytest.raises(ValueError, match="unknown notifier format 'slack'"):
        WebhookNotifier('http://127.0.0.1:9/hook', format='slack')
    with pytest.raises(ValueError, match='secret'):
        WebhookNotifier('http://127.0.0.1:9/hook', secret='s')
    with pytest.raises(TypeError, match='notifier must be a URL'):
        install_notifier(42)
