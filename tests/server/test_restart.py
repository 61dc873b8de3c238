"""kill -9 the server mid-run, restart it on the same data dir: runs and checkpoints are listed again, a client
resumes from its checkpoint with the optimizer state, the request that was in flight fails cleanly, and a rollout
session on /v1 keeps every finished call (its episodes are the same, token for token)."""

from __future__ import annotations

import signal
import subprocess

import httpx
import pytest
import tinker
from server_names import MODEL, openai_client
from tinker import types


def _start(data_dir, model_dir, port: int) -> subprocess.Popen:
    from twinkle_server.launch import start_process

    return start_process({MODEL: str(model_dir)}, str(data_dir), port)


class _At:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url


def _two_session_calls(url: str, key: str) -> tuple[str, dict]:
    """A rollout session with a two-call conversation (the openai client); its id and episodes."""
    with openai_client(_At(url), key) as client:
        session = client.post('/rollouts', body={'model': MODEL}, cast_to=object)['id']
        messages = [{'role': 'user', 'content': 'What is the weather in Paris?'}]
        for _ in range(2):
            extra = {'rollout_session': session}
            reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, extra_body=extra)
            messages += [{'role': 'assistant', 'content': reply.choices[0].message.content}]
            messages += [{'role': 'user', 'content': 'more'}]
        episodes = client.get(f'/rollouts/{session}/episodes', cast_to=object)
    assert episodes['data'][0]['calls'] == [0, 1]
    return session, episodes


@pytest.mark.slow
def test_kill_restart_list_and_resume(tmp_path, tiny_model_dir, sft_data):
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key
    from twinkle_server.store import Store

    store = Store(tmp_path)
    key = create_api_key(store, 'carol')
    store.close()
    port = free_port()
    url = f'http://127.0.0.1:{port}'
    proc = _start(tmp_path, tiny_model_dir, port)
    try:
        svc = tinker.ServiceClient(base_url=url, api_key=key)
        tc = svc.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()
        for _ in range(2):
            tc.forward_backward(sft_data, 'cross_entropy').result()
            tc.optim_step(types.AdamParams(learning_rate=5e-3)).result()
        path = tc.save_state('before-crash').result().path
        session, recorded = _two_session_calls(url, key)
        tc.forward_backward(sft_data, 'cross_entropy').result()
        tc.optim_step(types.AdamParams(learning_rate=5e-3)).result()
        expected = tc.forward(sft_data, 'cross_entropy').result().metrics['loss:sum']
        # a request still queued when the process dies
        with httpx.Client(base_url=url + '/api/v1', headers={'X-API-Key': key}) as http:
            in_flight = http.post(
                '/optim_step', json={'model_id': tc.model_id, 'seq_id': 10_000, 'adam_params': {}}
            ).json()['request_id']
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    proc = _start(tmp_path, tiny_model_dir, port)
    try:
        rest = tinker.RestClient(base_url=url, api_key=key)
        runs = {r.training_run_id for r in rest.list_training_runs().result().training_runs}
        assert tc.model_id in runs
        assert path in {c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
        with httpx.Client(base_url=url + '/api/v1', headers={'X-API-Key': key}) as http:
            failed = http.post('/retrieve_future', json={'request_id': in_flight}).json()
            assert 'restarted' in failed['error']
            gone = http.post('/get_info', json={'model_id': tc.model_id})
            assert gone.status_code == 404 and 'resume it from a checkpoint' in gone.json()['error']

        with openai_client(_At(url), key) as client:
            assert client.get(f'/rollouts/{session}/episodes', cast_to=object) == recorded
        svc = tinker.ServiceClient(base_url=url, api_key=key)
        resumed = svc.create_training_client_from_state_with_optimizer(path).result()
        resumed.forward_backward(sft_data, 'cross_entropy').result()
        resumed.optim_step(types.AdamParams(learning_rate=5e-3)).result()
        assert resumed.forward(sft_data, 'cross_entropy').result().metrics['loss:sum'] == pytest.approx(
            expected, rel=1e-5
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
