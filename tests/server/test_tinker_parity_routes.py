"""SDK 0.38 calls beyond training and sampling, through the unmodified `tinker` SDK against a real server: sessions
(list, get, search), external weights (export, signed download URLs), copies, publish/unpublish, checkpoint TTLs
and their expiry, batch future retrieval (`retrieve_futures`), `join_sampling_session`, `cancel_future`, and what
`/client/config` advertises -- each with its tenant isolation (another tenant's ids answer 404).

One server for the module (its minimum TTL and sweep interval shortened so that expiry is observable in seconds).
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker
from raw_http import datum
from server_names import MODEL
from tinker import types

from twinkle_server.store.checkpoint_files import parse_path

pytestmark = pytest.mark.filterwarnings('ignore::tinker.lib.experimental.ExperimentalWarning')
PROMPT = types.ModelInput.from_ints([5, 6, 7, 8])
GREEDY = types.SamplingParams(max_tokens=3, temperature=0.0, seed=1)


@pytest.fixture(scope='module')
def srv(tmp_path_factory, tiny_model_dir):
    from twinkle_server import ServerConfig, TenantLimits, start_in_thread
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    config = ServerConfig(
        models={MODEL: str(tiny_model_dir)},
        data_dir=str(tmp_path_factory.mktemp('parity-data')),
        port=free_port(),
        default_limits=TenantLimits().merged({'max_adapters': 64, 'max_sessions': 64}),
        min_checkpoint_ttl_s=1,
        checkpoint_sweep_s=0.3,
    )
    running = start_in_thread(config)
    keys = {who: create_api_key(running.service.store, who) for who in ('alice', 'bob', 'carol')}
    yield running, keys
    running.stop()


@pytest.fixture(scope='module')
def base_url(srv) -> str:
    return srv[0].base_url


@pytest.fixture(scope='module')
def svc(srv):
    return srv[0].service


@pytest.fixture(scope='module')
def keys(srv) -> dict[str, str]:
    return srv[1]


def _rest(base_url: str, key: str) -> tinker.RestClient:
    return tinker.RestClient(base_url=base_url, api_key=key)


def _http(base_url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base_url + '/api/v1', headers={'X-API-Key': key}, timeout=60)


def _status(exc_info: pytest.ExceptionInfo[BaseException]) -> int | None:
    """The HTTP status behind an SDK exception (the REST client raises `APIStatusError` subclasses)."""
    exc: BaseException | None = exc_info.value
    while exc is not None:
        if isinstance(exc, tinker.APIStatusError):
            return exc.status_code
        exc = exc.__cause__ or exc.__context__
    return None


@pytest.fixture(scope='module')
def alice(base_url, keys):
    """alice's session (project, display name, metadata) with a trained model and two saved checkpoints."""
    sc = tinker.ServiceClient(
        base_url=base_url,
        api_key=keys['alice'],
        project_id='proj-x',
        display_name='Nightly run alpha',
        user_metadata={'team': 'red'},
    )
    tc = sc.create_lora_training_client(base_model=MODEL, rank=4, seed=5).result()
    tc.forward_backward([datum(8, 11)], 'cross_entropy').result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    state = tc.save_state('state').result().path
    sampler = tc.save_weights_for_sampler('sampler').result().path
    return sc, tc, state, sampler


def test_client_config_advertises_what_is_served(base_url, keys):
    with _http(base_url, keys['alice']) as http:
        config = types.ClientConfigResponse.model_validate(
            http.post('/client/config', json={'sdk_version': 'x'}).json()
        )
        dynamic = types.ClientDynamicConfigResponse.model_validate(
            http.post('/client/dynamic_config', json={'sdk_version': 'x'}).json()
        )
    assert config.sample_use_retrieve_futures and config.sample_join_sampling_session
    assert config.custom_loss_server_side and not config.pjwt_auth_enabled  # tests/server/test_tinker_custom_loss.py
    assert dynamic.sample_cancel_enabled and dynamic.sample_cancel_max_batch_size >= 1


def test_sessions_list_get_search_and_isolation(base_url, keys, alice):
    sc, tc, _, _ = alice
    sid = sc.holder.get_session_id()
    sampler = sc.create_sampling_client(base_model=MODEL).result()
    rest = _rest(base_url, keys['alice'])

    assert sid in rest.list_sessions(limit=100).result().sessions
    got = rest.get_session(sid).result()
    assert tc.model_id in got.training_run_ids and sampler._sampling_session_id in got.sampler_ids
    assert got.user_metadata == {'team': 'red'} and got.display_name == 'Nightly run alpha'

    # a second session, finished by its client with a reason
    other = tinker.ServiceClient(base_url=base_url, api_key=keys['alice'], display_name='scratch')
    other.create_sampling_client(base_model=MODEL).result()
    other_sid = other.holder.get_session_id()
    other.close('errored', detail='boom').result()

    hits = rest.search_sessions(types.SessionSearchRequest(display_name='alpha NIGHTLY')).result().sessions
    assert [h.session_id for h in hits] == [sid]
    hit = hits[0]
    assert hit.project_id == 'proj-x' and hit.owner == 'alice' and hit.status == types.SessionActive()
    assert hit.checkpoints_count == 2 and hit.checkpoint_storage_bytes and hit.user_metadata == {'team': 'red'}
    finished = rest.search_sessions(
        types.SessionSearchRequest(statuses=[types.ClientFinishedSessionStatusQuery(reasons=['errored'])])
    ).result()
    assert [s.session_id for s in finished.sessions] == [other_sid]
    assert finished.sessions[0].status.reason.type == 'errored' and finished.sessions[0].status.detail == 'boom'
    by_meta = rest.search_sessions(types.SessionSearchRequest(user_metadata={'team': 'red'}, project_ids=['proj-x']))
    assert [s.session_id for s in by_meta.result().sessions] == [sid]

    # paging one at a time walks every session once, newest first
    walked, request = [], types.SessionSearchRequest(limit=1)
    while True:
        page = rest.search_sessions(request).result()
        walked += [s.session_id for s in page.sessions]
        if page.next_cursor is None:
            break
        request = request.model_copy(update={'cursor': page.next_cursor})
    assert walked == rest.list_sessions(limit=1000).result().sessions and {sid, other_sid} <= set(walked)

    bob = _rest(base_url, keys['bob'])
    with pytest.raises(Exception) as err:
        bob.get_session(sid).result()
    assert _status(err) == 404
    assert sid not in bob.list_sessions(limit=1000).result().sessions
    for req in (
        types.SessionSearchRequest(session_id=sid),
        types.SessionSearchRequest(session_id=sid, owner=types.AccessibleSearchOwner()),
        types.SessionSearchRequest(owner=types.UserSearchOwner(owner_urns=['alice'])),
    ):
        assert bob.search_sessions(req).result().sessions == []


def test_external_weights_export_download_and_isolation(base_url, keys, alice, svc):
    _, tc, _, _ = alice
    path = tc.save_weights_external('export', ttl_seconds=3600).result().path
    assert path == f'tinker://{tc.model_id}/external_weights/export'
    rest = _rest(base_url, keys['alice'])
    listed = {c.tinker_path: c for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
    assert listed[path].checkpoint_type == 'external' and listed[path].expires_at is not None

    urls = rest.get_external_weights_urls(path).result()
    assert {'adapter_model.safetensors', 'adapter_config.json'} <= set(urls.urls)
    assert urls.expires.timestamp() > time.time() + 600
    on_disk = Path(svc.store.checkpoint(tc.model_id, 'external_weights/export', 'alice').directory)
    for name, url in urls.urls.items():
        with urllib.request.urlopen(url, timeout=30) as r:  # a plain GET: no API key
            assert r.read() == (on_disk / name).read_bytes()
    assert json.loads((on_disk / 'adapter_config.json').read_text())['r'] == 4

    tampered = urls.urls['adapter_config.json'].replace('reader=alice', 'reader=bob')
    assert httpx.get(tampered).status_code == 403
    with pytest.raises(Exception) as err:
        _rest(base_url, keys['bob']).get_external_weights_urls(path).result()
    assert _status(err) == 404
    with pytest.raises(Exception, match='age_encryption_recipients'):
        tc.save_weights_external('sealed', age_encryption_recipients=['age1xyz']).result()
    rest.delete_checkpoint_from_tinker_path(path).result()
    assert httpx.get(urls.urls['adapter_config.json']).status_code == 404  # deleted: the URLs die with it


def test_copy_weights_shares_files_and_isolation(base_url, keys, alice, svc):
    _, tc, state, sampler = alice
    rest = _rest(base_url, keys['alice'])
    copy = rest.copy_weights(sampler, 'proj-archive').result()
    run = copy.split('/')[2]
    assert copy == f'tinker://{run}/sampler_weights/sampler' and run != tc.model_id
    entry = rest.get_training_run(run).result()
    assert entry.base_model == MODEL and entry.lora_rank == 4 and entry.last_sampler_checkpoint.tinker_path == copy
    src = Path(svc.store.checkpoint(tc.model_id, 'sampler_weights/sampler', 'alice').directory)
    dst = Path(svc.store.checkpoint(run, 'sampler_weights/sampler', 'alice').directory)
    assert os.stat(src / 'adapter_model.safetensors').st_ino == os.stat(dst / 'adapter_model.safetensors').st_ino

    sc = tinker.ServiceClient(base_url=base_url, api_key=keys['alice'], project_id='proj-archive')
    original = sc.create_sampling_client(model_path=sampler).result().sample(PROMPT, 1, GREEDY).result()
    copied = sc.create_sampling_client(model_path=copy).result().sample(PROMPT, 1, GREEDY).result()
    assert copied.sequences[0].tokens == original.sequences[0].tokens
    trainable = sc.copy_weights(state, ttl_seconds=7200).result()
    assert trainable.endswith('/weights/state')
    listed = {c.tinker_path: c for c in rest.list_user_checkpoints().result().checkpoints}
    assert listed[trainable].expires_at is not None and listed[copy].expires_at is None
    resumed = sc.create_training_client_from_state_with_optimizer(trainable).result()
    assert resumed.forward([datum(8, 11)], 'cross_entropy').result().metrics['loss:sum'] > 0

    # an idempotency key makes a retried copy return the first one
    with _http(base_url, keys['alice']) as http:
        body = {'source_path': sampler, 'destination_project_id': 'p'}
        first = http.post('/copy_weights', json=body, headers={'X-Idempotency-Key': 'k1'}).json()
        again = http.post('/copy_weights', json=body, headers={'X-Idempotency-Key': 'k1'}).json()
        assert first == again and first['tinker_path'] != copy

    bob = _rest(base_url, keys['bob'])
    with pytest.raises(Exception) as err:
        bob.copy_weights(sampler, 'mine').result()
    assert _status(err) == 404
    with pytest.raises(Exception) as err:
        bob.get_training_run(run).result()
    assert _status(err) == 404
    # with alice's key as the access token, bob may copy it into his own run
    mine = bob.copy_weights(sampler, 'mine', weights_access_token=keys['alice']).result()
    assert mine in {c.tinker_path for c in bob.list_user_checkpoints().result().checkpoints}
    assert mine not in {c.tinker_path for c in rest.list_user_checkpoints(limit=1000).result().checkpoints}


def test_publish_unpublish_and_isolation(base_url, keys, alice):
    _, tc, _, _ = alice
    path = tc.save_weights_for_sampler('shared').result().path
    rest, bob = _rest(base_url, keys['alice']), _rest(base_url, keys['bob'])
    bob_sc = tinker.ServiceClient(base_url=base_url, api_key=keys['bob'])
    with pytest.raises(Exception, match='404|not found'):
        bob_sc.create_sampling_client(model_path=path).result()

    rest.publish_checkpoint_from_tinker_path(path).result()
    assert {c.tinker_path: c.public for c in rest.list_checkpoints(tc.model_id).result().checkpoints}[path]
    with pytest.raises(Exception) as err:
        rest.publish_checkpoint_from_tinker_path(path).result()  # already public
    assert _status(err) == 400
    assert bob.get_weights_info_by_tinker_path(path).result().lora_rank == 4
    run = bob.get_training_run(tc.model_id, access_scope='accessible').result()
    assert run.last_sampler_checkpoint.tinker_path == path and run.last_checkpoint is None  # only what is public
    assert [c.tinker_path for c in bob.list_checkpoints(tc.model_id).result().checkpoints] == [path]
    sampler = bob_sc.create_sampling_client(model_path=path).result()
    assert len(sampler.sample(PROMPT, 1, GREEDY).result().sequences[0].tokens) == 3
    for call in (bob.unpublish_checkpoint_from_tinker_path, bob.delete_checkpoint_from_tinker_path):
        with pytest.raises(Exception) as err:
            call(path).result()
        assert _status(err) == 404
    with pytest.raises(Exception) as err:
        bob.set_checkpoint_ttl_from_tinker_path(path, 7200).result()
    assert _status(err) == 404

    rest.unpublish_checkpoint_from_tinker_path(path).result()  # revoked: bob's next request is refused
    with pytest.raises(Exception, match='404|not found'):
        sampler.sample(PROMPT, 1, GREEDY).result()
    with pytest.raises(Exception, match='404|not found'):
        bob_sc.create_sampling_client(model_path=path).result()
    with pytest.raises(Exception) as err:
        bob.get_training_run(tc.model_id, access_scope='accessible').result()
    assert _status(err) == 404


def test_checkpoint_ttl_expires_files_and_rows(base_url, keys, alice, svc):
    _, tc, _, _ = alice
    rest = _rest(base_url, keys['alice'])
    keep = tc.save_state('keep', ttl_seconds=60).result().path
    rest.set_checkpoint_ttl_from_tinker_path(keep, None).result()  # no expiry after all
    rest.set_checkpoint_ttl_from_tinker_path(keep, 3600).result()
    with pytest.raises(Exception) as err:
        rest.set_checkpoint_ttl_from_tinker_path(keep, 0).result()
    assert _status(err) == 400

    saved = time.time()
    short = tc.save_state('short-lived', ttl_seconds=5).result().path
    directory = svc.files.directory('alice', parse_path(short))
    listed = {c.tinker_path: c for c in rest.list_user_checkpoints().result().checkpoints}
    assert short in listed and saved + 4 < listed[short].expires_at.timestamp() < time.time() + 5
    assert directory.is_dir()
    deadline = time.monotonic() + 20
    while directory.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not directory.exists()
    listed = {c.tinker_path: c for c in rest.list_user_checkpoints().result().checkpoints}
    assert short not in listed and keep in listed and listed[keep].expires_at is not None
    assert svc.store.expired_checkpoints(time.time()) == []  # the rows are gone too
    with pytest.raises(Exception, match='not found'):
        rest.get_weights_info_by_tinker_path(short).result()


def test_retrieve_futures_join_and_isolation(base_url, keys):
    sc = tinker.ServiceClient(base_url=base_url, api_key=keys['alice'])
    sampler = sc.create_sampling_client(base_model=MODEL).result()
    # the SDK samples through retrieve_futures (advertised) and its unpickled clones join the session
    assert len(sampler.sample(PROMPT, 2, GREEDY).result().sequences) == 2
    clone = tinker.SamplingClient.from_sampler_handle(sampler.get_sampler_handle(), api_key=keys['alice'])
    assert (
        clone.sample(PROMPT, 1, GREEDY).result().sequences[0].tokens
        == sampler.sample(PROMPT, 1, GREEDY).result().sequences[0].tokens
    )
    sid = sampler._sampling_session_id
    assert clone._cloned_sampler_id == 1

    with _http(base_url, keys['alice']) as http, _http(base_url, keys['bob']) as bob:
        assert http.post('/join_sampling_session', json={'sampling_session_id': sid}).json()['client_counter'] == 2
        assert bob.post('/join_sampling_session', json={'sampling_session_id': sid}).status_code == 404

        seq = 7 * 10**9  # client 7 of the session
        body = {'sampling_session_id': sid, 'num_samples': 1, 'prompt': PROMPT.model_dump(mode='json')}
        body['sampling_params'] = GREEDY.model_dump(mode='json')
        rids = [http.post('/asample', json={**body, 'seq_id': seq + i}).json()['request_id'] for i in range(2)]
        target = {'sampling_session_id': sid, 'cloned_sampler_id': 7}
        seen: dict[str, Any] = {}
        cursor = 0
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:  # long polls: each returns as soon as one finishes
            page = types.FuturesRetrieveResponse.model_validate(
                http.post('/retrieve_futures', json={'target': target, 'prev_cursor': cursor}).json()
            )
            seen.update({c.request_id: c for c in page.completions})
            cursor = page.cursor
        assert set(seen) == set(rids) and all(c.state == 'finished' for c in seen.values())
        assert all(c.response_payload_uncompressed_size for c in seen.values())
        # acknowledged: nothing more; a lost answer (an older cursor again) is answered again
        again = http.post('/retrieve_futures', json={'target': target, 'prev_cursor': cursor, 'timeout': 0}).json()
        assert again == {'completions': [], 'cursor': cursor}
        replay = http.post('/retrieve_futures', json={'target': target, 'prev_cursor': 0, 'timeout': 0}).json()
        assert {c['request_id'] for c in replay['completions']} == set(rids) and replay['cursor'] > cursor
        # other clients of the session see none of them; bob sees nothing at all
        other = http.post(
            '/retrieve_futures',
            json={'target': {'sampling_session_id': sid, 'cloned_sampler_id': 3}, 'prev_cursor': 0, 'timeout': 0},
        )
        assert other.json()['completions'] == []
        assert bob.post('/retrieve_futures', json={'target': target, 'prev_cursor': 0, 'timeout': 0}).status_code == 404
        assert bob.post('/retrieve_future', json={'request_id': rids[0]}).status_code == 404


def test_cancel_queued_sample(base_url, keys, svc):
    """A sample abandoned while queued is cancelled by the SDK (`cancel_future`) and never runs; its future then
    fails as cancelled. Nobody else can cancel it."""
    from twinkle_server.engine.scheduler import Work

    worker = svc.workers[MODEL]
    started, release = threading.Event(), threading.Event()

    def hold(host: Any) -> None:
        started.set()
        release.wait(30)

    worker.submit(Work('zz-test', on_done=lambda r: None, on_error=lambda e: None, call=hold, op='test_hold'))
    try:
        assert started.wait(30)
        sc = tinker.ServiceClient(base_url=base_url, api_key=keys['carol'])
        sampler = sc.create_sampling_client(base_model=MODEL).result()
        passes = worker.stats['sample_passes']
        future = sampler.sample(PROMPT, 1, GREEDY)
        rid = _wait_for(lambda: next(iter(_pending_samples(svc, 'carol')), None))
        with _http(base_url, keys['bob']) as bob:
            assert bob.post('/cancel_future', json={'request_id': rid}).status_code == 404
        with _http(base_url, keys['carol']) as http:  # a queued request that is not sampling cannot be cancelled
            session = http.post('/create_session', json={'tags': [], 'user_metadata': None, 'sdk_version': 'raw'})
            create = http.post(
                '/create_model',
                json={
                    'session_id': session.json()['session_id'],
                    'model_seq_id': 0,
                    'base_model': MODEL,
                    'lora_config': {'rank': 2},
                },
            )
            assert http.post('/cancel_future', json={'request_id': create.json()['request_id']}).status_code == 400
        future.future().cancel()  # the SDK abandons it and tells the server (sample_cancel_enabled)
        _wait_for(lambda: svc.store.future(rid, 'carol').state == 'failed' or None)
        failure = json.loads(svc.store.future(rid, 'carol').body)
        assert failure['category'] == 'user' and 'cancelled' in failure['error']
    finally:
        release.set()
    assert worker.queue_depths()['sample'] == 0
    assert worker.stats['sample_passes'] == passes  # it never ran
    with _http(base_url, keys['carol']) as http:
        got = http.post('/retrieve_future', json={'request_id': rid}).json()
        assert 'cancelled' in got['error']  # what the SDK raises as RequestFailedError
        assert http.post('/cancel_future', json={'request_id': rid}).status_code == 200  # done: a no-op
        assert http.post('/cancel_future', json={'request_id': 'req-nope'}).status_code == 404


def _pending_samples(svc: Any, tenant: str) -> list[str]:
    out = []
    for rid in svc.store.pending_futures():
        row = svc.store.future(rid, tenant)
        if row is not None and row.target is not None and row.state == 'pending':
            out.append(rid)
    return out


def _wait_for(fn: Any, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError('timed out')


@pytest.fixture(params=['sqlite', 'postgresql'])
def store(request, tmp_path):
    """The metadata store on SQLite, and on a real PostgreSQL server (skipped where none can run)."""
    from twinkle_server.store import Store

    url = request.getfixturevalue('postgres_url') if request.param == 'postgresql' else None
    s = Store.open(url, tmp_path)
    yield s
    s.close()


def test_store_keeps_the_parity_state_on_both_databases(store):
    from twinkle_server.store import CheckpointRow, SamplingSessionRow

    store.add_session('s1', 'alice', [], {'k': 'v'}, 'proj', 'Name')
    store.finish_session('s1', 'errored', 'first')
    store.finish_session('s1', 'success', 'second')  # the first reason stays
    row = store.session('s1', 'alice')
    assert (row.project_id, row.display_name, row.finish_reason, row.finish_detail) == (
        'proj',
        'Name',
        'errored',
        'first',
    )
    assert store.session('s1', 'bob') is None and store.sessions('bob') == []
    store.add_training_run('s1:train:0', 'alice', 's1', MODEL, {'lora': {'rank': 2}})
    store.add_sampling_session(SamplingSessionRow('s1:sample:0', 'alice', 's1', MODEL, None, time.time()))
    assert store.session_members('s1', 'alice') == (['s1:train:0'], ['s1:sample:0'])
    assert [store.join_sampling_session('s1:sample:0', 'alice') for _ in range(3)] == [1, 2, 3]
    assert store.join_sampling_session('s1:sample:0', 'bob') is None

    ck = CheckpointRow('s1:train:0', 'weights/a', 'alice', 'training', '/nowhere', 10, time.time(), None, None)
    store.put_checkpoint(ck)
    assert store.readable_checkpoint('s1:train:0', 'weights/a', 'bob') is None
    assert store.set_checkpoint_public('s1:train:0', 'weights/a', 'bob', True) == 0
    assert store.set_checkpoint_public('s1:train:0', 'weights/a', 'alice', True) == 1
    assert store.set_checkpoint_public('s1:train:0', 'weights/a', 'alice', True) == 0  # public already
    assert store.readable_checkpoint('s1:train:0', 'weights/a', 'bob').public
    assert [r.run_id for r in store.training_runs('bob', 10, 0, accessible=True)[0]] == ['s1:train:0']
    assert store.session_checkpoint_stats('alice') == {'s1': (1, 10)}
    assert store.set_checkpoint_expiry('s1:train:0', 'weights/a', 'alice', time.time() - 1) == 1
    assert store.checkpoint('s1:train:0', 'weights/a', 'alice') is None  # expired: gone from lookups at once
    assert [r.checkpoint_id for r in store.expired_checkpoints(time.time())] == ['weights/a']
    assert store.delete_expired_checkpoint('s1:train:0', 'weights/a', time.time())
    assert store.expired_checkpoints(time.time()) == []

    store.add_future('r1', 'alice', 't#0')
    store.add_future('r2', 'alice', 't#0')
    store.add_future('r3', 'alice', 't#1')
    store.finish_future('r1', 'done', 'application/json', b'{}')
    store.finish_future('r3', 'done', 'application/json', b'{}')
    found, c1 = store.deliver_completions('alice', 't#0', 0)
    assert found == [('r1', 'done', 2)] and c1 > 0
    assert store.deliver_completions('alice', 't#0', c1) == ([], c1)
    store.finish_future('r2', 'failed', 'application/json', b'{"error": "x"}')
    found, c2 = store.deliver_completions('alice', 't#0', c1)
    assert [f[:2] for f in found] == [('r2', 'failed')] and c2 > c1
    replayed, c3 = store.deliver_completions('alice', 't#0', 0)  # the answers since 0 were lost
    assert {f[0] for f in replayed} == {'r1', 'r2'} and c3 > c2
    assert store.deliver_completions('bob', 't#0', 0) == ([], 0)
    assert store.future('r1', 'alice').target == 't#0' and store.future('r1', 'bob') is None

    assert store.setting('secret', 'a') == 'a' and store.setting('secret', 'b') == 'a'
    assert store.put_idempotent_result('alice', 'k', 'one') == 'one'
    assert store.put_idempotent_result('alice', 'k', 'two') == 'one'
    assert store.idempotent_result('bob', 'k') is None
