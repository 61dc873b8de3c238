"""Raw-HTTP helpers for server tests that send what the SDK never would (shared by several test modules)."""

from __future__ import annotations

import time
from typing import Any

import httpx
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output

PROTO = {'Content-Type': 'application/x-protobuf'}


def new_model(http: httpx.Client, base_model: str, rank: int = 2, seed: int = 0) -> tuple[str, str]:
    """(session_id, model_id) of a fresh training model created over raw HTTP."""
    sid = http.post('/create_session', json={'tags': [], 'user_metadata': None, 'sdk_version': 'raw'}).json()[
        'session_id'
    ]
    rid = http.post(
        '/create_model',
        json={
            'session_id': sid,
            'model_seq_id': 0,
            'base_model': base_model,
            'lora_config': {'rank': rank, 'seed': seed},
        },
    ).json()['request_id']
    assert result(http, rid)['model_id'] == f'{sid}:train:0'
    return sid, f'{sid}:train:0'


def result(http: httpx.Client, request_id: str, timeout_s: float = 120.0) -> Any:
    """The finished future: a JSON dict (a value, or an `{"error": ...}` failure) or protobuf bytes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = http.post('/retrieve_future', json={'request_id': request_id})
        assert r.status_code == 200, r.text
        if 'protobuf' in r.headers['content-type']:
            return r.content
        body = r.json()
        if body.get('type') != 'try_again':
            return body
    raise AssertionError(f'request {request_id} did not finish within {timeout_s} s')


def datum(n: int = 6, start: int = 5) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(list(range(start, start + n))),
        loss_fn_inputs={'target_tokens': list(range(start + 1, start + 1 + n)), 'weights': [1.0] * n},
    )


def fwdbwd_body(
    model_id: str, seq_id: int, datums: list, loss_fn: str = 'cross_entropy', forward_only: bool = False
) -> bytes:
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=datums, loss_fn=loss_fn),
        model_id=model_id,
        seq_id=seq_id,
    )
    msg = forward_backward_request_to_proto(req)
    msg.forward_only = forward_only
    return msg.SerializeToString()


def fwdbwd_loss(
    http: httpx.Client, model_id: str, seq_id: int, datums: list | None = None, forward_only: bool = False
) -> float:
    """Post a forward(-backward) and return its summed loss (asserts it was accepted and succeeded)."""
    r = http.post(
        '/forward_backward',
        content=fwdbwd_body(model_id, seq_id, datums or [datum()], forward_only=forward_only),
        headers=PROTO,
    )
    assert r.status_code == 200, r.text
    out = result(http, r.json()['request_id'])
    assert isinstance(out, bytes), out
    return deserialize_forward_backward_output(out).metrics['loss:sum']


def optim_step(http: httpx.Client, model_id: str, seq_id: int, lr: float = 1e-2) -> dict:
    r = http.post('/optim_step', json={'model_id': model_id, 'seq_id': seq_id, 'adam_params': {'learning_rate': lr}})
    assert r.status_code == 200, r.text
    out = result(http, r.json()['request_id'])
    assert 'metrics' in out, out
    return out


def assert_refused(r: httpx.Response, status: int, needle: str) -> dict:
    """A client mistake: exactly `status`, the project's JSON error body naming the problem, never retried."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert needle in body['error'] and body['category'] == 'user' and body['status'] == status, body
    assert r.headers.get('x-should-retry') == 'false' or status in (408, 409, 429), dict(r.headers)
    return body
