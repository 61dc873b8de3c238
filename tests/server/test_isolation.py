"""Tenant isolation: bob cannot see, sample from, load, delete or poll anything of alice's (404 everywhere)."""

from __future__ import annotations

import httpx
import pytest
import tinker
from server_names import MODEL


@pytest.fixture(scope='module')
def alice_run(service_client, sft_data):
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=11).result()
    tc.forward_backward(sft_data, 'cross_entropy').result()
    state = tc.save_state('private').result().path
    sampler = tc.save_weights_for_sampler('private-s').result().path
    return tc, state, sampler


def test_bob_sees_nothing_of_alice(server, bob, alice_run):
    tc, state, sampler_path = alice_run
    rest = tinker.RestClient(base_url=server.base_url, api_key=bob)
    assert tc.model_id not in {r.training_run_id for r in rest.list_training_runs(limit=1000).result().training_runs}
    assert state not in {c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints}
    headers = {'X-API-Key': bob}
    with httpx.Client(base_url=server.base_url + '/api/v1', headers=headers) as http:
        for method, path, body in [
            ('GET', f'/training_runs/{tc.model_id}', None),
            ('GET', f'/training_runs/{tc.model_id}/checkpoints', None),
            ('DELETE', f'/training_runs/{tc.model_id}/checkpoints/weights/private', None),
            ('POST', '/weights_info', {'tinker_path': state}),
            ('POST', '/get_info', {'model_id': tc.model_id}),
            ('POST', '/optim_step', {'model_id': tc.model_id, 'seq_id': 99, 'adam_params': {}}),
            ('POST', '/save_weights', {'model_id': tc.model_id, 'path': 'steal', 'seq_id': 99}),
        ]:
            r = http.request(method, path, json=body)
            assert r.status_code == 404, (path, r.status_code, r.text)
            assert 'not found' in r.json()['error']


def test_bob_cannot_sample_load_or_poll(server, bob, alice, alice_run, sft_data):
    tc, state, sampler_path = alice_run
    svc = tinker.ServiceClient(base_url=server.base_url, api_key=bob)
    with pytest.raises(Exception, match='404|not found'):
        svc.create_sampling_client(model_path=sampler_path).result()
    with pytest.raises(Exception, match='not found'):
        svc.create_training_client_from_state(state).result()
    # alice's future id is invisible to bob
    with httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': alice}) as http:
        sid = http.post('/create_session', json={'tags': [], 'user_metadata': None, 'sdk_version': 'raw'}).json()[
            'session_id'
        ]
        rid = http.post(
            '/create_model',
            json={'session_id': sid, 'model_seq_id': 0, 'base_model': MODEL, 'lora_config': {'rank': 2}},
        ).json()['request_id']
        r = http.post('/retrieve_future', headers={'X-API-Key': bob}, json={'request_id': rid})
        assert r.status_code == 404
        r = http.post('/retrieve_future', json={'request_id': rid})
        assert r.status_code == 200 and r.json()['model_id'] == f'{sid}:train:0'
        r = http.post(
            '/create_sampling_session',
            headers={'X-API-Key': bob},
            json={'session_id': sid, 'sampling_session_seq_id': 0, 'base_model': MODEL},
        )
        assert r.status_code == 404  # bob cannot use alice's session either
    # and alice's run still works
    assert tc.forward(sft_data, 'cross_entropy').result().metrics['loss:sum'] > 0


def test_bad_keys_are_rejected(server):
    with httpx.Client(base_url=server.base_url + '/api/v1') as http:
        for headers in ({}, {'X-API-Key': 'tml-nope'}, {'X-API-Key': 'tml-000000000000wrongsecret'}):
            r = http.post(
                '/create_session',
                headers=headers,
                json={'tags': [], 'user_metadata': None, 'sdk_version': 'x', 'type': 'create_session'},
            )
            assert r.status_code == 401 and 'API key' in r.json()['error']
