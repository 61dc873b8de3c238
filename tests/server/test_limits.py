"""Per-tenant limits answer clear 4xx (never 402) and leave other tenants alone."""

from __future__ import annotations

import pytest
import tinker
from server_names import MODEL

from twinkle_server.config import TenantLimits


@pytest.fixture()
def limited(server):
    key = server.key('limited')
    server.service.config.tenant_limits['limited'] = TenantLimits().merged({'max_adapters': 1, 'max_lora_rank': 8})
    yield key
    server.service.config.tenant_limits.pop('limited')


def test_rank_and_adapter_limits(server, limited):
    svc = tinker.ServiceClient(base_url=server.base_url, api_key=limited)
    with pytest.raises(Exception, match='rank 16 exceeds the limit max_lora_rank=8'):
        svc.create_lora_training_client(base_model=MODEL, rank=16).result()
    svc.create_lora_training_client(base_model=MODEL, rank=8).result()
    with pytest.raises(Exception, match='max_adapters=1'):
        # a cap the client cannot wait out: 403, never retried by the SDK
        import httpx

        with httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': limited}) as http:
            sid = http.post('/create_session', json={'tags': [], 'user_metadata': None, 'sdk_version': 'x'}).json()[
                'session_id'
            ]
            r = http.post(
                '/create_model',
                json={'session_id': sid, 'model_seq_id': 0, 'base_model': MODEL, 'lora_config': {'rank': 2}},
            )
            assert r.status_code == 403 and r.headers['x-should-retry'] == 'false'
            raise RuntimeError(r.json()['error'])


def test_request_rate_limit(server, limited):
    import httpx

    server.service.config.tenant_limits['limited'] = TenantLimits().merged({'requests_per_minute': 3})
    with httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': limited}) as http:
        codes = [http.get('/get_server_capabilities').status_code for _ in range(5)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
