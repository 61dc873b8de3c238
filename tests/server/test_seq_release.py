"""A refused request never stalls its model: every rejection path is followed by a good request of the same model
and client (the next seq_id), which completes; a seq_id that never arrives fails the waiting work after a bounded
wait; a stranger cannot free someone else's seq_id; a retryable refusal keeps it for the retry."""

from __future__ import annotations

import math
import time

import httpx
import pytest
from raw_http import PROTO, assert_refused, datum, fwdbwd_body, fwdbwd_loss, new_model, optim_step, result
from server_names import MODEL


@pytest.fixture()
def http(server, alice):
    with httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': alice}, timeout=60) as client:
        yield client


def _big_body(model_id: str, seq_id: int, size: int) -> bytes:
    """A real ForwardBackwardRequest (model_id and seq_id first on the wire) padded past `size` bytes."""
    n = size // 16 + 1
    return fwdbwd_body(model_id, seq_id, [datum(n)])


def _chunks(body: bytes, size: int = 256 * 1024):
    for i in range(0, len(body), size):
        yield body[i : i + size]


REJECTIONS = {
    # name: (send the refused request with this seq_id, expected status, words of the message)
    'body over the limit (Content-Length)': (
        lambda http, m, s, limit: http.post('/forward_backward', content=_big_body(m, s, limit), headers=PROTO),
        413,
        'exceeds the server limit',
    ),
    'body over the limit (chunked)': (
        lambda http, m, s, limit: http.post(
            '/forward_backward', content=_chunks(_big_body(m, s, limit)), headers=PROTO
        ),
        413,
        'exceeds the server limit',
    ),
    'learning_rate NaN': (
        lambda http, m, s, limit: http.post(
            '/optim_step',
            content=('{"model_id": "%s", "seq_id": %d, "adam_params": {"learning_rate": NaN}}' % (m, s)).encode(),
        ),
        400,
        'learning_rate must be a finite number',
    ),
    'negative learning_rate': (
        lambda http, m, s, limit: http.post(
            '/optim_step', json={'model_id': m, 'seq_id': s, 'adam_params': {'learning_rate': -1.0}}
        ),
        400,
        'learning_rate must be a finite number in [0, 10]',
    ),
    'beta1 out of range': (
        lambda http, m, s, limit: http.post(
            '/optim_step', json={'model_id': m, 'seq_id': s, 'adam_params': {'learning_rate': 1e-3, 'beta1': 1.0}}
        ),
        400,
        'beta1 must be a finite number in [0, 1)',
    ),
    'eps zero': (
        lambda http, m, s, limit: http.post(
            '/optim_step', json={'model_id': m, 'seq_id': s, 'adam_params': {'learning_rate': 1e-3, 'eps': 0.0}}
        ),
        400,
        'eps must be a finite number in (0, 1]',
    ),
    'optim_step missing a field': (
        lambda http, m, s, limit: http.post('/optim_step', json={'model_id': m, 'seq_id': s}),
        400,
        'Field required',
    ),
    'truncated JSON': (
        lambda http, m, s, limit: http.post('/optim_step', content=f'{{"model_id": "{m}", "seq_id": {s}, '.encode()),
        400,
        'not valid JSON',
    ),
    'unknown loss_fn': (
        lambda http, m, s, limit: http.post(
            '/forward_backward', content=fwdbwd_body(m, s, [datum()], 'nope'), headers=PROTO
        ),
        422,
        "unknown loss_fn 'nope'",
    ),
    'tensor length mismatch': (
        lambda http, m, s, limit: http.post(
            '/forward_backward',
            headers=PROTO,
            content=fwdbwd_body(
                m,
                s,
                [
                    __import__('tinker').types.Datum(
                        model_input=__import__('tinker').types.ModelInput.from_ints([5, 6, 7]),
                        loss_fn_inputs={'target_tokens': [6, 7]},
                    )
                ],
            ),
        ),
        422,
        'has 2 values',
    ),
    'too many tokens': (
        lambda http, m, s, limit: http.post(
            '/forward_backward', headers=PROTO, content=fwdbwd_body(m, s, [datum(300)] * 120)
        ),
        413,
        'max_tokens_per_request=32768',
    ),
    'save_weights with a bad name': (
        lambda http, m, s, limit: http.post('/save_weights', json={'model_id': m, 'seq_id': s, 'path': '../x'}),
        400,
        'invalid checkpoint name',
    ),
    'load_weights of a bad path': (
        lambda http, m, s, limit: http.post(
            '/load_weights', json={'model_id': m, 'seq_id': s, 'path': 'x://y', 'optimizer': False}
        ),
        400,
        'invalid checkpoint path',
    ),
}


@pytest.mark.parametrize('case', list(REJECTIONS))
def test_a_refused_request_is_followed_by_a_good_one(server, http, case):
    send, status, needle = REJECTIONS[case]
    _, model_id = new_model(http, MODEL)
    fwdbwd_loss(http, model_id, 1)
    assert_refused(send(http, model_id, 2, server.service.config.max_body_bytes), status, needle)
    # seq_id 2 was refused before it was queued: seq_id 3 of the same model and client runs at once
    t0 = time.monotonic()
    assert math.isfinite(fwdbwd_loss(http, model_id, 3))
    optim_step(http, model_id, 4)
    assert time.monotonic() - t0 < 30


def test_a_seq_id_that_never_arrives_fails_the_waiting_work_then_the_model_moves_on(server, http):
    _, model_id = new_model(http, MODEL)
    worker = server.service.workers[MODEL]
    old, worker.seq_gap_timeout_s = worker.seq_gap_timeout_s, 1.0
    try:
        waiting = http.post('/forward_backward', content=fwdbwd_body(model_id, 2, [datum()]), headers=PROTO)
        t0 = time.monotonic()
        failed = result(http, waiting.json()['request_id'], timeout_s=30)
        assert time.monotonic() - t0 < 10
        assert 'seq_id 1 never arrived' in failed['error'] and 'seq_id 3' in failed['error'], failed
        assert failed['category'] == 'user'
        assert math.isfinite(fwdbwd_loss(http, model_id, 3))  # the sequence moved on past the hole
        late = http.post('/forward_backward', content=fwdbwd_body(model_id, 1, [datum()]), headers=PROTO)
        assert_refused(late, 400, 'was already used')
    finally:
        worker.seq_gap_timeout_s = old


@pytest.mark.slow
def test_another_tenant_cannot_free_my_seq_id(server, http, bob):
    _, model_id = new_model(http, MODEL)
    with httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': bob}, timeout=60) as stranger:
        r = stranger.post('/optim_step', json={'model_id': model_id, 'seq_id': 1, 'adam_params': {}})
        assert r.status_code in (400, 404)
    parked = http.post(
        '/forward_backward', content=fwdbwd_body(model_id, 2, [datum()], forward_only=True), headers=PROTO
    ).json()['request_id']
    time.sleep(0.5)
    assert http.post('/retrieve_future', json={'request_id': parked}).json()['type'] == 'try_again'
    fwdbwd_loss(http, model_id, 1, forward_only=True)  # the owner's seq 1 still counts ...
    assert isinstance(result(http, parked), bytes)  # ... and releases seq 2


def test_a_retryable_refusal_keeps_the_seq_id_for_the_retry(server, http):
    """429 (too many requests in flight) is retried by the SDK with the same seq_id: it must still be free."""
    _, model_id = new_model(http, MODEL)
    limits = server.service.config.default_limits
    server.service.config.tenant_limits['alice'] = limits.merged({'max_pending_futures': 0})
    try:
        r = http.post('/forward_backward', content=fwdbwd_body(model_id, 1, [datum()]), headers=PROTO)
        assert r.status_code == 429 and 'max_pending_futures=0' in r.json()['error']
        assert int(r.headers['retry-after']) >= 1 and 'x-should-retry' not in r.headers
    finally:
        server.service.config.tenant_limits.pop('alice')
    assert math.isfinite(fwdbwd_loss(http, model_id, 1))  # the retry with the same seq_id runs
