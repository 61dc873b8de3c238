"""Per-tenant limits answer clear 4xx (never 402) and leave other tenants alone."""
from __future__ import annotations

import pytest
import tinker

from conftest import MODEL
from twinkle_server.config import TenantLimits


@pytest.fixture()
def limited(server):
    key = server.key('limited')
    server.service.config.tenant_limits['limited'] = TenantLimits(max_adapters=1, max_lora_rank=8,
                                                                 requests_per_minute=None)
    yield key
    server.service.config.tenant_limits.pop('limited')


def test_rank_and_adapter_limits(server, limited):
    svc = tinker.ServiceClient(base_url=server.base_url, api_key=limited)
    with pytest.raises(Exception, match='rank 16 exceeds the limit 8'):
        svc.create_lora_training_client(base_model=MODEL, rank=16).result()
    svc.create_lora_training_client(base_model=MODEL, rank=8).result()
    with pytest.raises(Exception, match='limit 1'):
        # 429 is retried by the SDK with backoff; ask the server directly to see the answer at once
        import httpx
        with httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': limited}) as http:
            sid = http.post('/create_session', json={'tags': [], 'user_metadata': None, 'sdk_version': 'x'}
                            ).json()['session_id']
            r = http.post('/create_model', json={'session_id': sid, 'model_seq_id': 0, 'base_model': MODEL,
                                                 'lora_config': {'rank': 2}})
            assert r.status_code == 429
            raise RuntimeError(r.json()['error'])


def test_request_rate_limit(server, limited):
    import httpx
    server.service.config.tenant_limits['limited'] = TenantLimits(requests_per_minute=3)
    with httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': limited}) as http:
        codes = [http.get('/get_server_capabilities').status_code for _ in range(5)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
