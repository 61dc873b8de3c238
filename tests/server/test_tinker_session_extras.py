"""`RestClient.assign_session_project`, `export_session_trace` and `whoami` through the unmodified `tinker` SDK
against a real server: a project assignment is stored (it survives a restart) and shows in `search_sessions`; a
trace names the session's model, checkpoint and requests and is fetched through a signed URL; another tenant's
session answers 404 to both. `whoami` decodes a JWT client-side, which this API-key server never issues.
Plus the store methods and migration 5 behind them, on SQLite and (where one can run) PostgreSQL.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import tinker
from raw_http import datum
from server_names import MODEL
from tinker import types

pytestmark = pytest.mark.filterwarnings('ignore::tinker.lib.experimental.ExperimentalWarning')


def _start(data_dir: str, model_dir: str) -> Any:
    from twinkle_server import ServerConfig, TenantLimits, start_in_thread
    from twinkle_server.launch import free_port

    config = ServerConfig(
        models={MODEL: model_dir},
        data_dir=data_dir,
        port=free_port(),
        default_limits=TenantLimits().merged({'max_adapters': 16, 'max_sessions': 16}),
    )
    return start_in_thread(config)


@pytest.fixture(scope='module')
def srv(tmp_path_factory, tiny_model_dir):
    from twinkle_server.service.auth import create_api_key

    running = _start(str(tmp_path_factory.mktemp('extras-data')), str(tiny_model_dir))
    keys = {who: create_api_key(running.service.store, who) for who in ('alice', 'bob')}
    yield running, keys
    running.stop()


def _rest(base_url: str, key: str) -> tinker.RestClient:
    return tinker.RestClient(base_url=base_url, api_key=key)


def _status(exc_info: pytest.ExceptionInfo[BaseException]) -> int | None:
    """The HTTP status behind an SDK exception (the REST client raises `APIStatusError` subclasses)."""
    exc: BaseException | None = exc_info.value
    while exc is not None:
        if isinstance(exc, tinker.APIStatusError):
            return exc.status_code
        exc = exc.__cause__ or exc.__context__
    return None


def _project(rest: tinker.RestClient, sid: str) -> str | None:
    hits = rest.search_sessions(types.SessionSearchRequest(session_id=sid)).result().sessions
    return hits[0].project_id if hits else None


def test_assign_session_project_is_stored_survives_a_restart_and_is_tenant_isolated(tmp_path, tiny_model_dir):
    from twinkle_server.service.auth import create_api_key

    running = _start(str(tmp_path), str(tiny_model_dir))
    try:
        alice = create_api_key(running.service.store, 'alice')
        bob = create_api_key(running.service.store, 'bob')
        sc = tinker.ServiceClient(base_url=running.base_url, api_key=alice, project_id='proj-a')
        sid = sc.holder.get_session_id()
        rest = _rest(running.base_url, alice)
        assert _project(rest, sid) == 'proj-a'

        assert rest.assign_session_project(sid, 'proj-b').result() is None
        assert _project(rest, sid) == 'proj-b'
        in_b = rest.search_sessions(types.SessionSearchRequest(project_ids=['proj-b'])).result().sessions
        in_a = rest.search_sessions(types.SessionSearchRequest(project_ids=['proj-a'])).result().sessions
        assert [h.session_id for h in in_b] == [sid] and in_a == []

        # another tenant's session, an unknown one: 404; a missing project: 400 -- nothing changes
        with pytest.raises(Exception) as err:
            _rest(running.base_url, bob).assign_session_project(sid, 'proj-evil').result()
        assert _status(err) == 404
        with pytest.raises(Exception) as err:
            rest.assign_session_project('sess-nope', 'proj-b').result()
        assert _status(err) == 404
        with pytest.raises(Exception) as err:
            rest.assign_session_project(sid, '').result()
        assert _status(err) == 400
        assert _project(rest, sid) == 'proj-b'
        sc.close('success').result()
    finally:
        running.stop()

    restarted = _start(str(tmp_path), str(tiny_model_dir))
    try:
        assert _project(_rest(restarted.base_url, alice), sid) == 'proj-b'
    finally:
        restarted.stop()


def _trace(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=60) as response:  # no API key: the signature is the credential
        return json.loads(response.read())


def _forged(url: str, **changes: str) -> int:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()} | changes
    try:
        urllib.request.urlopen(parts._replace(query=urlencode(query)).geturl(), timeout=60)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


def test_export_session_trace_shows_models_checkpoints_and_requests_and_is_tenant_isolated(srv):
    running, keys = srv
    sc = tinker.ServiceClient(base_url=running.base_url, api_key=keys['alice'], project_id='traced')
    sid = sc.holder.get_session_id()
    tc = sc.create_lora_training_client(base_model=MODEL, rank=4, seed=3).result()
    tc.forward_backward([datum(8, 11)], 'cross_entropy').result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    state = tc.save_state('traced-state').result().path
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints([5, 6, 7])
    sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2, temperature=0.0, seed=1)).result()

    rest = _rest(running.base_url, keys['alice'])
    url = rest.export_session_trace(sid).result()
    trace = _trace(url)
    events = trace['traceEvents']
    tracks = {e['args']['name']: e['tid'] for e in events if e['ph'] == 'M' and e['name'] == 'thread_name'}
    model_track = tracks[tc.model_id]
    checkpoints = [e for e in events if e['name'] == 'checkpoint weights/traced-state']
    assert [(c['tid'], c['args']['tinker_path']) for c in checkpoints] == [(model_track, state)]
    spans = {(e['name'], e['tid']) for e in events if e['ph'] == 'X' and e['args']['state'] == 'done'}
    assert {('create_model', model_track), ('forward_backward', model_track), ('optim_step', model_track)} <= spans
    assert ('save_state', model_track) in spans
    assert ('sample', tracks[sampler._sampling_session_id]) in spans
    summary = trace['twinkle']
    assert summary['session']['session_id'] == sid and summary['session']['project_id'] == 'traced'
    assert [r['run_id'] for r in summary['training_runs']] == [tc.model_id]
    assert state in {c['tinker_path'] for c in summary['checkpoints']}
    assert summary['requests']['included'] == summary['requests']['total'] >= 5 and not summary['truncated']

    # another tenant: 404 for the export, and alice's URL does not open for another owner or a changed signature
    with pytest.raises(Exception) as err:
        _rest(running.base_url, keys['bob']).export_session_trace(sid).result()
    assert _status(err) == 404
    assert _forged(url, owner='bob') == 403
    assert _forged(url, sig='0' * 64) == 403
    assert _forged(url, expires=str(int(time.time()) - 1)) == 403
    sc.close('success').result()


def test_whoami_needs_a_jwt_which_this_server_never_issues(srv):
    """Documented, not served: the SDK reads whoami from the claims of an auth-exchange JWT without calling the
    server, and `/client/config` keeps `pjwt_auth_enabled` off (API keys only)."""
    running, keys = srv
    with pytest.raises(RuntimeError, match='requires JWT auth'):
        _rest(running.base_url, keys['alice']).whoami().result()


@pytest.fixture(params=['sqlite', 'postgresql'])
def store_url(request) -> str | None:
    return request.getfixturevalue('postgres_url') if request.param == 'postgresql' else None


def test_migration_5_keeps_existing_rows_and_the_store_tracks_session_requests(store_url, tmp_path):
    from twinkle_server.store import Store
    from twinkle_server.store.db import open_database
    from twinkle_server.store.db.migrations import MIGRATIONS, migrate

    db = open_database(store_url, tmp_path)  # a database at schema 4, with a session and a future
    migrate(db, MIGRATIONS[:4])
    db.execute(
        'INSERT INTO sessions (session_id, tenant, created_at, last_seen, finished, tags, user_metadata, project_id) '
        "VALUES ('s1', 'alice', 1.0, 1.0, 0, '[]', 'null', 'p0')"
    )
    db.execute(
        "INSERT INTO futures (request_id, tenant, state, created_at, target) VALUES ('old', 'alice', 'pending', 1.0, "
        "'s1:sample:0#0')"
    )
    db.close()

    store = Store.open(store_url, tmp_path)
    try:
        assert store.migrated == list(range(5, len(MIGRATIONS) + 1))  # 5 and any later ones
        assert store.session('s1', 'alice').project_id == 'p0' and store.future('old', 'alice').state == 'pending'
        store.set_session_project('s1', 'bob', 'evil')  # another tenant's: nothing changes
        store.set_session_project('s1', 'alice', 'p1')
        assert store.session('s1', 'alice').project_id == 'p1'

        store.add_future('f1', 'alice', session_id='s1', op='forward_backward', model_id='s1:train:0')
        store.add_future('f2', 'alice', 's1:sample:0#0', session_id='s1', op='sample')
        store.finish_future('f2', 'failed', 'application/json', b'{"error": "bad"}')
        rows, total = store.session_requests('s1', 'alice', 10)
        assert total == 2 and [(r.request_id, r.op, r.state) for r in rows] == [
            ('f2', 'sample', 'failed'),
            ('f1', 'forward_backward', 'pending'),
        ]
        assert rows[0].error == b'{"error": "bad"}' and rows[0].finished_at and rows[1].model_id == 's1:train:0'
        assert store.session_requests('s1', 'alice', 1)[1] == 2
        assert store.session_requests('s1', 'bob', 10) == ([], 0)
    finally:
        store.close()
