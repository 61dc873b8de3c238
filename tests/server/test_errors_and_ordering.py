"""Bad requests answer 4xx with a JSON message and the server keeps serving; seq_id order is enforced."""

from __future__ import annotations

import time

import httpx
import pytest
from raw_http import PROTO, assert_refused, datum, fwdbwd_body, new_model, result
from server_names import MODEL
from tinker import types


@pytest.fixture(autouse=True)
def short_long_poll(server):
    """Poll answers come back after 0.5 s instead of 30 s (the try_again path is exercised either way)."""
    old, server.service.config.long_poll_s = server.service.config.long_poll_s, 0.5
    yield
    server.service.config.long_poll_s = old


@pytest.fixture()
def raw(server, alice):
    """(http client, model_id) of a fresh model created over raw HTTP."""
    with httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': alice}, timeout=60) as http:
        _, model_id = new_model(http, MODEL)
        yield http, model_id


def test_bad_requests_then_a_good_one(raw, server):
    http, model_id = raw
    assert_refused(http.post('/forward_backward', content=b'\xff\x00garbage', headers=PROTO), 400, 'protobuf')
    short = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7]),
        loss_fn_inputs={'target_tokens': [6, 7], 'weights': [1.0, 1.0]},
    )
    assert_refused(
        http.post('/forward_backward', content=fwdbwd_body(model_id, 1, [short]), headers=PROTO),
        422,
        'has 2 values but the model input has 3 tokens',
    )
    assert_refused(
        http.post('/forward_backward', content=fwdbwd_body(model_id, 2, [datum()], 'made_up_loss'), headers=PROTO),
        422,
        "unknown loss_fn 'made_up_loss'",
    )
    image = types.Datum(
        model_input=types.ModelInput(chunks=[types.ImageChunk(data=b'\x89PNG', format='png')]),
        loss_fn_inputs={'target_tokens': [1]},
    )
    assert_refused(
        http.post('/forward_backward', content=fwdbwd_body(model_id, 3, [image]), headers=PROTO),
        400,
        'does not accept images',
    )
    r = http.post('/forward_backward', content=fwdbwd_body('sess-nope:train:0', 1, [datum()]), headers=PROTO)
    assert r.status_code == 404
    assert_refused(http.post('/optim_step', content=b'{not json'), 400, 'not valid JSON')
    assert_refused(http.post('/optim_step', json={'model_id': model_id}), 400, 'optim_params: Field required')
    assert_refused(http.post('/forward_backward', content=b'x' * (3 * 1024 * 1024), headers=PROTO), 413, 'exceeds')
    # the rejected seq_ids 1-3 were skipped: seq 4 runs (it would wait forever otherwise)
    r = http.post('/forward_backward', content=fwdbwd_body(model_id, 4, [datum()]), headers=PROTO)
    assert r.status_code == 200, r.text
    out = types.ForwardBackwardOutput  # decoded by the SDK's own codec
    from tinker.proto.response_conv import deserialize_forward_backward_output

    output = deserialize_forward_backward_output(result(http, r.json()['request_id']))
    assert isinstance(output, out) and output.metrics['loss:sum'] > 0
    assert http.get('/healthz').json() == {'status': 'ok'}


def test_work_runs_in_seq_id_order_even_when_posted_out_of_order(raw):
    """seq 3 (an optimizer step with a huge lr) is posted before seq 2 (a forward): the forward must still see
    the untouched weights, and seq 4 (another forward) the updated ones."""
    http, model_id = raw
    before = result(
        http,
        http.post('/forward_backward', content=fwdbwd_body(model_id, 1, [datum()]), headers=PROTO).json()['request_id'],
    )  # seq 1: gradients for the step
    from tinker.proto.response_conv import deserialize_forward_backward_output as decode

    loss_before = decode(before).metrics['loss:sum']

    step = http.post(
        '/optim_step', json={'model_id': model_id, 'seq_id': 3, 'adam_params': {'learning_rate': 0.5}}
    ).json()['request_id']
    time.sleep(0.5)  # seq 3 is parked: seq 2 has not arrived
    assert _poll_once(http, step)['type'] == 'try_again'
    fwd = http.post(
        '/forward_backward', content=fwdbwd_body(model_id, 2, [datum()], forward_only=True), headers=PROTO
    ).json()['request_id']
    assert decode(result(http, fwd)).metrics['loss:sum'] == pytest.approx(loss_before, rel=1e-5)
    assert 'metrics' in result(http, step)
    after = http.post(
        '/forward_backward', content=fwdbwd_body(model_id, 4, [datum()], forward_only=True), headers=PROTO
    ).json()['request_id']
    assert decode(result(http, after)).metrics['loss:sum'] != pytest.approx(loss_before, rel=1e-3)


def test_reposting_a_request_returns_the_same_future(raw):
    """A client retry after a lost response must not run the work twice."""
    http, model_id = raw
    body = fwdbwd_body(model_id, 1, [datum()], forward_only=True)
    first = http.post('/forward_backward', content=body, headers=PROTO).json()['request_id']
    again = http.post('/forward_backward', content=body, headers=PROTO).json()['request_id']
    assert first == again
    sid = model_id.split(':train:')[0]
    create = {'session_id': sid, 'model_seq_id': 0, 'base_model': MODEL, 'lora_config': {'rank': 2, 'seed': 0}}
    assert (
        http.post('/create_model', json=create).json()['request_id']
        == http.post('/create_model', json=create).json()['request_id']
    )


def test_long_poll_answers_try_again_shape(server, raw):
    http, model_id = raw
    rid = http.post(
        '/optim_step', json={'model_id': model_id, 'seq_id': 7, 'adam_params': {'learning_rate': 0.0}}
    ).json()['request_id']
    t0 = time.monotonic()
    body = _poll_once(http, rid)
    assert body == {'type': 'try_again', 'request_id': rid, 'queue_state': 'active'}
    assert time.monotonic() - t0 >= 0.4  # it long-polled before answering


def _poll_once(http: httpx.Client, rid: str) -> dict:
    r = http.post('/retrieve_future', json={'request_id': rid})
    return r.json()


def test_sample_queue_full_answers_429(server, raw):
    http, _ = raw
    sid = http.post('/create_session', json={'tags': [], 'user_metadata': None, 'sdk_version': 'raw'}).json()[
        'session_id'
    ]
    ssid = http.post(
        '/create_sampling_session', json={'session_id': sid, 'sampling_session_seq_id': 0, 'base_model': MODEL}
    ).json()['sampling_session_id']
    worker = server.service.workers[MODEL]
    old, worker.max_queued_samples = worker.max_queued_samples, 0
    try:
        r = http.post(
            '/asample',
            json={
                'sampling_session_id': ssid,
                'seq_id': 0,
                'num_samples': 1,
                'prompt': {'chunks': [{'type': 'encoded_text', 'tokens': [5, 6]}]},
                'sampling_params': {'max_tokens': 2},
            },
        )
        assert r.status_code == 429 and 'full' in r.json()['error']
    finally:
        worker.max_queued_samples = old
