"""Checkpoints pushed to a hub (here the project's local stand-in, TWINKLE_HUB_ROOT): every save of a model that
pushes, private by default; per-request opt-in (Tinker user_metadata, native `hub_push=True`); a failing push
leaves the checkpoint usable and records the error; credentials and destinations come from the operator only."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

TOKEN_ENV = 'TWINKLE_TEST_HUB_TOKEN'
OPERATOR_TOKEN = 'operator-secret-token'
AUTO, OPT_IN = 'push-every-save', 'push-on-request'


@pytest.fixture(scope='module')
def hub(tmp_path_factory, tiny_model_dir):
    """A server hosting the tiny model twice: AUTO pushes every save (private), OPT_IN only saves that ask
    (public repos). Uploads go through the real `upload_folder`, recorded."""
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.config import HubPushConfig, ModelSpec
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    root = tmp_path_factory.mktemp('hub-root')
    with pytest.MonkeyPatch.context() as env:
        env.setenv('TWINKLE_HUB_ROOT', str(root))
        env.setenv(TOKEN_ENV, OPERATOR_TOKEN)
        push = HubPushConfig(enabled=True, hub='hf', repo_prefix='org/twinkle-', token_env=TOKEN_ENV)
        specs = {
            AUTO: ModelSpec(AUTO, str(tiny_model_dir), hub_push=push),
            OPT_IN: ModelSpec(
                OPT_IN,
                str(tiny_model_dir),
                hub_push=HubPushConfig(
                    enabled=True, hub='ms', repo_prefix='org', private=False, token_env=TOKEN_ENV, per_request=True
                ),
            ),
        }
        config = ServerConfig(
            models={}, model_specs=specs, data_dir=str(tmp_path_factory.mktemp('data')), port=free_port()
        )
        running = start_in_thread(config)
        pusher = running.service.pusher
        real, uploads = pusher.uploader, []

        def recording(folder, ref, **kw):
            uploads.append({'ref': ref, 'files': sorted(p.name for p in Path(folder).rglob('*') if p.is_file()), **kw})
            return real(folder, ref, **kw)

        pusher.uploader = recording
        key = create_api_key(running.service.store, 'alice')
        yield {'running': running, 'root': root, 'key': key, 'uploads': uploads}
        running.stop()


def _client(hub, base_model: str, seed: int = 0):
    import tinker

    svc = tinker.ServiceClient(base_url=hub['running'].base_url, api_key=hub['key'])
    return svc.create_lora_training_client(base_model=base_model, rank=4, seed=seed).result()


def _listed(hub, run_id: str, path: str, timeout_s: float = 60.0):
    """The checkpoint's Tinker listing entry once its push (if any) is no longer pending."""
    import tinker

    rest = tinker.RestClient(base_url=hub['running'].base_url, api_key=hub['key'])
    deadline = time.monotonic() + timeout_s
    while True:
        found = {c.tinker_path: c for c in rest.list_checkpoints(run_id).result().checkpoints}[path]
        if (found.user_metadata or {}).get('twinkle.hub_push.state') != 'pending' or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _raw_listing(hub, run_id: str) -> dict:
    with httpx.Client(base_url=hub['running'].base_url + '/api/v1', headers={'X-API-Key': hub['key']}) as http:
        return {c['tinker_path']: c for c in http.get(f'/training_runs/{run_id}/checkpoints').json()['checkpoints']}


def test_every_save_is_pushed_private_into_the_runs_repo(hub, sft_data, tiny_model_dir):
    from tinker import types

    tc = _client(hub, AUTO)
    tc.forward_backward(sft_data, 'cross_entropy').result()
    tc.optim_step(types.AdamParams(learning_rate=5e-3)).result()
    state = tc.save_state('step-1').result().path
    sampler = tc.save_weights_for_sampler('sampler-1').result().path
    repo = 'twinkle-alice-' + tc.model_id.replace(':', '-')
    for path, sub in ((state, 'weights/step-1'), (sampler, 'sampler_weights/sampler-1')):
        meta = _listed(hub, tc.model_id, path).user_metadata
        assert meta['twinkle.hub_push.state'] == 'pushed', meta
        assert meta['twinkle.hub_push.repo'] == f'hf://org/{repo}' and meta['twinkle.hub_push.private'] == 'true'
        assert meta['twinkle.hub_push.path_in_repo'] == sub and 'twinkle.hub_push.pushed_at' in meta
        pushed = hub['root'] / 'hf' / 'org' / repo / 'main' / sub
        svc = hub['running'].service
        written = Path(svc.store.checkpoint(tc.model_id, sub, 'alice').directory)
        assert (pushed / 'adapter_model.safetensors').read_bytes() == (
            written / 'adapter_model.safetensors'
        ).read_bytes()
    assert (hub['root'] / 'hf' / 'org' / repo / 'main' / 'weights/step-1' / 'training_state.pt').is_file()
    from peft import PeftModel  # what a user of the hub repo does with a pushed checkpoint
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    PeftModel.from_pretrained(base, str(hub['root'] / 'hf' / 'org' / repo / 'main'), subfolder='weights/step-1')
    assert json.loads((hub['root'] / 'hf' / 'org' / repo / '.twinkle-repo.json').read_text()) == {'private': True}
    raw = _raw_listing(hub, tc.model_id)[state]['hub_push']  # the native client's view
    assert raw['state'] == 'pushed' and raw['private'] is True and raw['repo'] == f'hf://org/{repo}'
    # the unnamed snapshot behind a sampling client is not a checkpoint of the run: never pushed
    before = len(hub['uploads'])
    tc.save_weights_and_get_sampling_client()
    time.sleep(0.3)
    assert len(hub['uploads']) == before


def test_per_request_models_push_only_saves_that_ask(hub):
    tc = _client(hub, OPT_IN, seed=1)
    plain = tc.save_state('plain').result().path
    asked = tc.save_state('asked', user_metadata={'twinkle.hub_push': 'true', 'note': 'kept'}).result().path
    assert 'twinkle.hub_push.state' not in (_listed(hub, tc.model_id, plain).user_metadata or {})
    meta = _listed(hub, tc.model_id, asked).user_metadata
    assert meta['twinkle.hub_push.state'] == 'pushed' and meta['note'] == 'kept'
    assert meta['twinkle.hub_push.private'] == 'false'  # this model's repos are public
    repo = hub['root'] / 'ms' / 'org' / ('alice-' + tc.model_id.replace(':', '-'))
    assert sorted(p.name for p in (repo / 'master' / 'weights').iterdir()) == ['asked']
    assert json.loads((repo / '.twinkle-repo.json').read_text()) == {'private': False}

    # the native API opts in with save(..., hub_push=True)
    from twinkle_client import MultiLoraTransformersModel, TwinkleClient

    client = TwinkleClient(hub['running'].base_url, hub['key'])
    try:
        model = MultiLoraTransformersModel(model_id=OPT_IN, client=client)
        model.add_adapter_to_model('mine', {'r': 4, 'lora_alpha': 8, 'seed': 0})
        skipped = model.save('native-plain', adapter_name='mine')
        pushed = model.save('native-asked', hub_push=True, adapter_name='mine')
        run_id = model.server_model_id('mine')
        assert 'twinkle.hub_push.state' not in (
            _listed(hub, run_id, skipped.replace('twinkle', 'tinker', 1)).user_metadata or {}
        )
        assert (
            _listed(hub, run_id, pushed.replace('twinkle', 'tinker', 1)).user_metadata['twinkle.hub_push.state']
            == 'pushed'
        )
    finally:
        client.close()


def test_a_failing_push_leaves_the_checkpoint_usable_and_records_why(hub, sft_data, tmp_path, monkeypatch):
    import tinker

    blocker = tmp_path / 'not-a-directory'
    blocker.write_text('')
    monkeypatch.setenv('TWINKLE_HUB_ROOT', str(blocker / 'hub'))  # every upload into it fails
    tc = _client(hub, AUTO, seed=2)
    path = tc.save_state('doomed').result().path  # the save itself succeeds
    listed = _listed(hub, tc.model_id, path)
    assert listed.user_metadata['twinkle.hub_push.state'] == 'failed'
    assert 'Error' in listed.user_metadata['twinkle.hub_push.error']
    assert _raw_listing(hub, tc.model_id)[path]['hub_push']['error']
    svc = tinker.ServiceClient(base_url=hub['running'].base_url, api_key=hub['key'])
    resumed = svc.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.forward(sft_data, 'cross_entropy').result().metrics['loss:sum'] > 0


def test_clients_cannot_supply_credentials_or_destinations(hub):
    tc = _client(hub, AUTO, seed=3)
    forged = {
        'twinkle.hub_push.token': 'client-token',
        'twinkle.hub_push.repo': 'hf://evil/x',
        'twinkle.hub_push.state': 'pushed',
        'hf_token': 'client-token',
    }
    path = tc.save_state('forged', user_metadata=forged).result().path
    meta = _listed(hub, tc.model_id, path).user_metadata
    assert meta['twinkle.hub_push.repo'] == 'hf://org/twinkle-alice-' + tc.model_id.replace(':', '-')
    assert 'twinkle.hub_push.token' not in meta and OPERATOR_TOKEN not in json.dumps(meta)
    upload = next(u for u in hub['uploads'] if u['path_in_repo'] == 'weights/forged')
    assert upload['token'] == OPERATOR_TOKEN and upload['ref'].org == 'org'  # the operator's, never the client's
    assert not (hub['root'] / 'hf' / 'evil').exists()
    # a request field for credentials is refused outright (the Tinker request types forbid unknown fields)
    with httpx.Client(base_url=hub['running'].base_url + '/api/v1', headers={'X-API-Key': hub['key']}) as http:
        r = http.post(
            '/save_weights',
            json={'model_id': tc.model_id, 'path': 'with-token', 'seq_id': 10, 'hub_token': 'client-token'},
        )
        assert r.status_code == 400 and 'hub_token' in r.text


def test_uploads_never_hold_up_the_models_queue(hub, sft_data):
    import threading

    pusher = hub['running'].service.pusher
    release, recording = threading.Event(), pusher.uploader

    def stuck(folder, ref, **kw):
        release.wait(60)
        return recording(folder, ref, **kw)

    pusher.uploader = stuck
    try:
        tc = _client(hub, AUTO, seed=4)
        path = tc.save_state('slow-upload').result().path
        tc.forward_backward(sft_data, 'cross_entropy').result()  # runs while the upload is stuck
        assert _listed(hub, tc.model_id, path, timeout_s=0).user_metadata['twinkle.hub_push.state'] == 'pending'
    finally:
        release.set()
        pusher.uploader = recording
    assert _listed(hub, tc.model_id, path).user_metadata['twinkle.hub_push.state'] == 'pushed'


# ---- naming, configuration and the hub clients (no server) ----------------------------------------------------------
def test_a_push_cut_short_by_shutdown_is_recorded_failed(tmp_path):
    import threading

    from twinkle_server.config import HubPushConfig
    from twinkle_server.service.hub_push import HubPusher
    from twinkle_server.store import CheckpointRow, Store

    store = Store(tmp_path)
    (tmp_path / 'ck').mkdir()
    (tmp_path / 'ck' / 'adapter_model.safetensors').write_bytes(b'x')
    release = threading.Event()
    cfg = HubPushConfig(enabled=True, hub='hf', repo_prefix='org')
    pusher = HubPusher(store, tmp_path, {'m': cfg}, uploader=lambda *a, **kw: release.wait(30))
    try:
        for name in ('a', 'b'):  # 'a' uploads (stuck), 'b' waits in the queue
            row = CheckpointRow('r', f'weights/{name}', 't', 'training', str(tmp_path / 'ck'), 1, 1.0, None, None)
            store.put_checkpoint(row)
            pusher.submit(row, pusher.wanted('m', None))
        pusher.close(wait_s=0.2)
        for name in ('a', 'b'):
            push = store.push('r', f'weights/{name}', 't')
            assert push.state == 'failed' and 'server stopped' in push.error
    finally:
        release.set()
        store.close()


def test_repo_names_are_valid_hub_names():
    from twinkle_server.config import HubPushConfig
    from twinkle_server.service.hub_push import MAX_REPO_NAME, repo_for, validate

    cfg = HubPushConfig(enabled=True, hub='hf', repo_prefix='my-org/run-')
    ref = repo_for(cfg, 'alice', 'sess-0123:train:0')
    assert (ref.repo_url, ref.repo) == ('hf://my-org/run-alice-sess-0123-train-0', 'run-alice-sess-0123-train-0')
    long = repo_for(cfg, 'a' * 80, 'sess-x:train:1')
    assert len(long.repo) <= MAX_REPO_NAME and long.repo != repo_for(cfg, 'a' * 80, 'sess-y:train:1').repo
    assert repo_for(HubPushConfig(enabled=True, repo_prefix='org'), 't..x', '--r').repo == 't.x-r'
    for bad, why in (
        (HubPushConfig(enabled=True, repo_prefix=None), 'repo_prefix'),
        (HubPushConfig(enabled=True, hub='gh', repo_prefix='org'), 'hub must be'),
    ):
        with pytest.raises(ValueError, match=why):
            validate(bad)
    validate(HubPushConfig(enabled=False))


def test_upload_uses_the_hub_clients_with_private_repo_token_and_subfolder(tmp_path, monkeypatch):
    """Without the stand-in: huggingface_hub / modelscope upload APIs (recorded, no network)."""
    import sys
    import types

    import huggingface_hub

    from twinkle_core.hub.publish import upload_folder
    from twinkle_core.hub.ref import HubRef

    monkeypatch.delenv('TWINKLE_HUB_ROOT', raising=False)
    (tmp_path / 'adapter_model.safetensors').write_bytes(b'x')
    calls = []
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        'create_repo',
        lambda self, repo_id, **kw: calls.append(('hf-create', repo_id, kw, self.token)),
    )
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        'upload_folder',
        lambda self, **kw: (
            calls.append(('hf-upload', kw['repo_id'], kw, self.token))
            or types.SimpleNamespace(oid='c' * 40, commit_url='u')
        ),
    )
    assert upload_folder(
        tmp_path, HubRef('hf', 'org', 'run'), message='m', path_in_repo='weights/a', private=True, token='tok'
    ) == ('u', 'c' * 40)
    assert calls[0] == ('hf-create', 'org/run', {'exist_ok': True, 'repo_type': None, 'private': True}, 'tok')
    assert calls[1][2]['path_in_repo'] == 'weights/a' and calls[1][3] == 'tok'

    class FakeMsApi:
        def create_repo(self, repo_id, **kw):
            calls.append(('ms-create', repo_id, kw))

        def upload_folder(self, repo_id, folder_path=None, **kw):
            calls.append(('ms-upload', repo_id, kw))

    monkeypatch.setitem(sys.modules, 'modelscope.hub.api', types.SimpleNamespace(HubApi=FakeMsApi))
    calls.clear()
    upload_folder(
        tmp_path, HubRef('ms', 'org', 'run'), message='m', path_in_repo='weights/a', private=True, token='tok'
    )
    assert calls[0] == ('ms-create', 'org/run', {'exist_ok': True, 'visibility': 'private', 'token': 'tok'})
    assert calls[1][2]['path_in_repo'] == 'weights/a' and calls[1][2]['token'] == 'tok'
