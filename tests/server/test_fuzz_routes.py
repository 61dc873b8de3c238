"""Property-based fuzzing of every route of the service (the app's OpenAPI paths), against a real server.

For each route, Hypothesis draws requests from the SDK's request models (`fuzz_strategies.from_json_schema`) and bends
them (wrong types, dropped and unknown fields, extreme numbers, random bytes, ids of the caller's and of another
tenant's objects); a hand-written seed list per route replays the defects found by earlier hostile probes first.
Every answer must be:

- below 500 (a client's input is never a server error), and a queued request never finishes with a 5xx failure;
- for a 4xx, the project's JSON error shape (`error`, `category`, `status`) with `x-should-retry: false` unless the
  status is one a client should retry (408/409/429);
- on time (no hang past `DEADLINE_S`);

and a second tenant (bob) keeps completing training steps between alice's requests. The run is derandomized (the
same requests every CI run); `TWINKLE_FUZZ_EXAMPLES` sets the number of drawn requests per route (default 30,
about three minutes in all) and `TWINKLE_FUZZ_SEED` explores other requests.
"""

from __future__ import annotations

import os
import time

import httpx
import pytest
from fuzz_route_requests import ROUTES, Fuzz, Request
from fuzz_route_seeds import seed_requests
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from raw_http import new_model, result
from server_names import MODEL

DEADLINE_S = 30.0
EXAMPLES = int(os.environ.get('TWINKLE_FUZZ_EXAMPLES', '30'))
RETRYABLE = (408, 409, 429)
FUTURE_WAIT_S = 5.0  # a queued request is followed this long; one still pending after that is not a failure


@pytest.fixture(scope='module')
def fuzz(tmp_path_factory, tiny_model_dir):
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    config = ServerConfig(
        models={MODEL: str(tiny_model_dir)},
        data_dir=str(tmp_path_factory.mktemp('fuzz-data')),
        port=free_port(),
        max_body_bytes=2 * 1024 * 1024,
    )
    running = start_in_thread(config)
    timeout = httpx.Timeout(DEADLINE_S)
    keys = {who: create_api_key(running.service.store, who) for who in ('alice', 'bob')}
    alice = httpx.Client(base_url=running.base_url, headers={'X-API-Key': keys['alice']}, timeout=timeout)
    bob = httpx.Client(base_url=running.base_url + '/api/v1', headers={'X-API-Key': keys['bob']}, timeout=timeout)
    api = httpx.Client(base_url=running.base_url + '/api/v1', headers={'X-API-Key': keys['alice']}, timeout=timeout)
    session, model = new_model(api, MODEL)
    _, bob_model = new_model(bob, MODEL, seed=3)
    sampling = api.post(
        '/create_sampling_session', json={'session_id': session, 'sampling_session_seq_id': 0, 'base_model': MODEL}
    ).json()['sampling_session_id']
    native_model = alice.post('/twinkle/v1/models', json={'base_model': MODEL, 'config': {'r': 2}}).json()['model_id']
    sampler = alice.post('/twinkle/v1/samplers', json={'base_model': MODEL}).json()['sampler_id']
    save = bob.post('/save_weights', json={'model_id': bob_model, 'seq_id': 1, 'path': 'bob-ck'})
    bob_checkpoint = result(bob, save.json()['request_id'])['path']
    real_ids = [
        session,
        model,
        sampling,
        native_model,
        sampler,
        bob_model,
        bob_checkpoint,
        MODEL,
        f'tinker://{model}/weights/nope',
        f'{session}:train:7',
        'hf://secretdir/.',
        '../../etc/passwd',
    ]
    yield Fuzz(
        running.base_url,
        alice,
        bob,
        st.sampled_from(real_ids),
        session,
        model,
        sampling,
        native_model,
        sampler,
        bob_model,
        bob_seq=2,
    )
    for client in (alice, bob, api):
        client.close()
    running.stop()


# ---- the checks -----------------------------------------------------------------------------------------------------


def _send(f: Fuzz, req: Request) -> httpx.Response:
    try:
        return f.alice.request(
            req.method, req.path, json=req.json, content=req.content, params=req.params, headers=req.headers
        )
    except httpx.TimeoutException:
        pytest.fail(f'no answer within {DEADLINE_S} s: {req}')


def _check(f: Fuzz, req: Request, r: httpx.Response) -> None:
    assert r.status_code < 500, f'{r.status_code} for {req}: {r.text[:500]}'
    if r.status_code >= 400:
        try:
            body = r.json()
        except ValueError:
            pytest.fail(f'{r.status_code} without a JSON body for {req}: {r.text[:300]}')
        if req.path.startswith('/v1/'):  # the OpenAI-compatible routes answer in OpenAI's error shape
            error = body.get('error') if isinstance(body, dict) else None
            assert isinstance(error, dict) and set(error) == {'message', 'type', 'param', 'code'}, (req, body)
            assert isinstance(error['message'], str) and error['message'] and isinstance(error['type'], str), body
        else:
            assert isinstance(body, dict) and isinstance(body.get('error'), str) and body['error'], (req, body)
            assert body.get('category') in ('user', 'server', 'unknown') and body.get('status') == r.status_code, body
        if r.status_code not in RETRYABLE:
            assert r.headers.get('x-should-retry') == 'false', (req, r.status_code, dict(r.headers))
        return
    if 'json' in r.headers.get('content-type', '') and isinstance(r.json(), dict) and 'request_id' in r.json():
        _check_future(f, req, r.json()['request_id'])


def _check_future(f: Fuzz, req: Request, request_id: str) -> None:
    """A queued request that finished must not have failed with a server error."""
    deadline = time.monotonic() + FUTURE_WAIT_S
    while time.monotonic() < deadline:
        r = f.alice.post('/api/v1/retrieve_future', json={'request_id': request_id})
        assert r.status_code < 500, (req, r.status_code, r.text[:300])
        if r.status_code != 200 or 'json' not in r.headers.get('content-type', ''):
            return
        body = r.json()
        if body.get('type') == 'try_again':
            continue
        if 'error' in body:
            assert body.get('status', 0) < 500 and body.get('category') != 'server', (req, body)
        return


def test_the_fuzzer_covers_every_route(fuzz):
    paths = fuzz.alice.get('/openapi.json').json()['paths']
    routes = {(method, path) for path, ops in paths.items() for method in ops}
    assert routes == set(ROUTES), {'not fuzzed': routes - set(ROUTES), 'gone': set(ROUTES) - routes}


@pytest.mark.parametrize('route', list(ROUTES), ids=[f'{m.upper()} {p}' for m, p in ROUTES])
def test_route_survives_fuzzing_and_bob_keeps_training(fuzz, route):
    for req in seed_requests(fuzz).get(route, []):
        _check(fuzz, req, _send(fuzz, req))

    @seed(int(os.environ.get('TWINKLE_FUZZ_SEED', '0')))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize='TWINKLE_FUZZ_SEED' not in os.environ,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(ROUTES[route](fuzz))
    def run(req: Request) -> None:
        _check(fuzz, req, _send(fuzz, req))
        fuzz.requests += 1
        if fuzz.requests % 10 == 0:
            fuzz.bob_step()

    run()
    fuzz.bob_step()  # the route's worst requests did not stop another tenant's training
