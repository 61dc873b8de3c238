"""The metadata store on SQLite and on a real PostgreSQL server (started by the `postgres` fixture): the same
contract on both, numbered migrations (legacy SQLite files stamped, nothing applied twice, concurrent starts,
newer schemas refused, failures rolled back), clear errors for bad or unreachable URLs, and a PostgreSQL-backed
server that restarts without losing runs."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from server_names import MODEL

BACKENDS = ['sqlite', 'postgres']


@pytest.fixture(params=BACKENDS)
def url(request, tmp_path) -> str | None:
    """A database URL of each backend (None: the default SQLite file in the data dir)."""
    return request.getfixturevalue('postgres_url') if request.param == 'postgres' else None


@pytest.fixture
def store(url, tmp_path):
    from twinkle_server.store import Store

    s = Store.open(url, tmp_path)
    yield s
    s.close()


# ---- the store contract, on both backends ---------------------------------------------------------------------------
def test_api_keys(store):
    store.add_api_key('k1', 'alice', b'\x00salt\xff', b'\x01digest')
    store.add_api_key('k2', 'bob', b's', b'd')
    assert store.api_key('k1') == ('alice', b'\x00salt\xff', b'\x01digest')
    assert store.api_key('nope') is None
    assert store.tenants() == ['alice', 'bob']
    assert store.revoke_api_keys('alice') == 1
    assert store.api_key('k1') is None and store.tenants() == ['bob']


def test_sessions_are_per_tenant(store):
    store.add_session('s1', 'alice', ['t'], {'a': 1})
    assert store.session_state('s1', 'alice') == 'active'
    assert store.session_state('s1', 'bob') is None
    before = store.session_last_seen('s1')
    time.sleep(0.01)
    store.touch_session('s1')
    assert store.session_last_seen('s1') > before
    assert store.count_live_sessions('alice', before - 1) == 1 and store.count_live_sessions('bob', 0) == 0
    store.finish_session('s1')
    assert store.session_state('s1', 'alice') == 'finished' and store.session_last_seen('s1') is None


def test_training_runs_page_and_stay_per_tenant(store):
    for i in range(5):
        store.add_training_run(f'r{i}', 'alice', 's', MODEL, {'lora': {'rank': i + 1}}, {'i': i})
        time.sleep(0.002)
    store.add_training_run('b0', 'bob', 's', MODEL, {'lora': {'rank': 1}})
    store.add_training_run('r0', 'alice', 's', MODEL, {'lora': {'rank': 9}})  # re-created: replaced
    rows, total = store.training_runs('alice', 2, 1)
    assert total == 5 and len(rows) == 2 and all(r.tenant == 'alice' for r in rows)
    assert store.training_run('r0', 'alice').lora_config == {'lora': {'rank': 9}}
    assert store.training_run('r1', 'alice').user_metadata == {'i': 1}
    assert store.training_run('r0', 'bob') is None and store.count_training_runs('bob') == 1
    store.mark_corrupted('r1')
    store.touch_training_run('r1')
    row = store.training_run('r1', 'alice')
    assert row.corrupted and row.last_request_time >= row.created_at


def test_checkpoints_listed_hidden_replaced_deleted(store):
    from twinkle_server.store import CheckpointRow

    big = 5 * 2**30  # larger than a 32-bit integer
    t = 1_700_000_000.123456789
    store.put_checkpoint(CheckpointRow('r', 'weights/a', 'alice', 'training', '/d/a', big, t, {'k': 'v'}, None))
    store.put_checkpoint(
        CheckpointRow('r', 'sampler_weights/s', 'alice', 'sampler', '/d/s', 1, t + 1, None, None, listed=False)
    )
    row = store.checkpoint('r', 'weights/a', 'alice')
    assert row.size_bytes == big and row.created_at == t and row.user_metadata == {'k': 'v'} and row.listed
    assert [c.checkpoint_id for c in store.checkpoints('alice')] == ['weights/a']
    assert [c.checkpoint_id for c in store.checkpoints('alice', 'r', hidden=True)] == ['sampler_weights/s']
    assert store.checkpoint('r', 'weights/a', 'bob') is None and store.checkpoints('bob') == []
    store.put_checkpoint(CheckpointRow('r', 'weights/a', 'alice', 'training', '/d/a2', 7, t + 2, None, None))
    assert store.checkpoint('r', 'weights/a', 'alice').directory == '/d/a2'
    store.delete_checkpoint('r', 'weights/a')
    assert store.checkpoint('r', 'weights/a', 'alice') is None


def test_checkpoint_pushes(store):
    from twinkle_server.store import CheckpointRow, PushRow

    ck = CheckpointRow('r', 'weights/a', 'alice', 'training', '/d', 1, 1.0, None, None)
    store.put_checkpoint(ck)
    push = PushRow('r', 'weights/a', 'alice', 'hf://org/alice-r', 'weights/a', True, 'pending', time.time())
    store.put_push(push)
    assert store.push('r', 'weights/a', 'bob') is None
    assert not store.finish_push('r', 'weights/a', push.requested_at + 1, None)  # not this push
    assert store.finish_push('r', 'weights/a', push.requested_at, None)
    done = store.push('r', 'weights/a', 'alice')
    assert done.state == 'pushed' and done.private and done.pushed_at and done.error is None
    assert list(store.pushes('alice')) == [('r', 'weights/a')] and store.pushes('alice', 'other') == {}
    store.put_checkpoint(ck)  # re-saved: the earlier push no longer describes it
    assert store.push('r', 'weights/a', 'alice') is None
    store.put_push(push)
    assert store.fail_pending_pushes('stopped') == 1
    assert store.push('r', 'weights/a', 'alice').error == 'stopped'
    store.delete_checkpoint('r', 'weights/a')
    assert store.pushes('alice') == {}


def test_sampling_sessions_and_futures(store):
    from twinkle_server.store import SamplingSessionRow

    store.add_sampling_session(SamplingSessionRow('ss', 'alice', 's', MODEL, 'tinker://r/weights/a', 1.5))
    assert store.sampling_session('ss', 'alice').model_path == 'tinker://r/weights/a'
    assert store.sampling_session('ss', 'bob') is None
    store.add_future('f1', 'alice')
    store.add_future('f2', 'alice')
    assert sorted(store.pending_futures()) == ['f1', 'f2']
    body = bytes(range(256)) * 10
    store.finish_future('f1', 'done', 'application/x-protobuf', body)
    f = store.future('f1', 'alice')
    assert (f.state, f.content_type, f.body) == ('done', 'application/x-protobuf', body)
    assert store.future('f1', 'bob') is None and store.future('f2', 'alice').body is None
    assert store.prune_futures(older_than_s=3600) == 0 and store.prune_futures(older_than_s=-1) == 1
    assert list(store.pending_futures()) == ['f2']


def test_many_threads_at_once(store):
    """The server calls the store from its event loop and from every model's worker thread."""
    errors = []

    def work(i: int) -> None:
        try:
            for j in range(25):
                store.add_future(f'f{i}-{j}', f't{i % 3}')
                store.finish_future(f'f{i}-{j}', 'done', 'application/json', b'{}')
                assert store.future(f'f{i}-{j}', f't{i % 3}').state == 'done'
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(store.future(f'f{i}-{j}', f't{i % 3}') is not None for i in range(12) for j in range(25)) == 300


def test_fronts_sharing_postgres_recover_only_their_own_futures(postgres_url, tmp_path):
    """At start a server fails the futures left pending by its previous run, never another live server's."""
    from twinkle_server.store import Store

    a, b = (Store.open(postgres_url, tmp_path, owner=o) for o in ('host-a:8000', 'host-b:8000'))
    anyone = Store.open(postgres_url, tmp_path)
    sqlite = Store(tmp_path, owner='host-a:8000')
    try:
        a.add_future('fa', 't')
        b.add_future('fb', 't')
        assert list(a.pending_futures()) == ['fa'] and list(b.pending_futures()) == ['fb']
        assert sorted(anyone.pending_futures()) == ['fa', 'fb']
        assert sqlite.owner is None  # one server per SQLite file
    finally:
        for s in (a, b, anyone, sqlite):
            s.close()


# ---- migrations -----------------------------------------------------------------------------------------------------
# What the store (`twinkle_server/store.py`, now `store/__init__.py`) created before migrations existed (server.db
# files in the field have it).
PRE_MIGRATION_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, salt BLOB NOT NULL, digest BLOB NOT NULL,
    created_at REAL NOT NULL, revoked INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, created_at REAL NOT NULL, last_seen REAL NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0, tags TEXT, user_metadata TEXT);
CREATE TABLE IF NOT EXISTS training_runs (
    run_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT NOT NULL, base_model TEXT NOT NULL,
    lora_config TEXT NOT NULL, user_metadata TEXT, created_at REAL NOT NULL, last_request_time REAL NOT NULL,
    corrupted INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS training_runs_tenant ON training_runs (tenant, created_at);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id TEXT NOT NULL, checkpoint_id TEXT NOT NULL, tenant TEXT NOT NULL, kind TEXT NOT NULL,
    directory TEXT NOT NULL, size_bytes INTEGER, created_at REAL NOT NULL, user_metadata TEXT,
    expires_at REAL, listed INTEGER NOT NULL DEFAULT 1, PRIMARY KEY (run_id, checkpoint_id));
CREATE INDEX IF NOT EXISTS checkpoints_tenant ON checkpoints (tenant, created_at);
CREATE TABLE IF NOT EXISTS sampling_sessions (
    sampling_session_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, session_id TEXT, base_model TEXT NOT NULL,
    model_path TEXT, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS futures (
    request_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, content_type TEXT,
    body BLOB, created_at REAL NOT NULL, finished_at REAL);
"""


def test_pre_migration_sqlite_file_is_stamped_and_readable(tmp_path):
    from twinkle_server.store import Store
    from twinkle_server.store.db.migrations import LATEST, applied_versions

    old = sqlite3.connect(tmp_path / 'server.db')
    old.executescript(PRE_MIGRATION_SCHEMA)
    old.execute("INSERT INTO api_keys VALUES ('k', 'alice', x'01', x'02', 1.0, 0)")
    old.execute(
        "INSERT INTO training_runs VALUES ('r', 'alice', 's', 'm', '{\"lora\": {\"rank\": 4}}', 'null', 1.0, 2.0, 0)"
    )
    old.execute("INSERT INTO checkpoints VALUES ('r', 'weights/a', 'alice', 'training', '/d', 3, 1.0, NULL, NULL, 1)")
    old.commit()
    old.close()
    store = Store(tmp_path)
    try:
        assert store.migrated == list(range(2, LATEST + 1))  # 1 stamped, not run
        assert applied_versions(store.db) == list(range(1, LATEST + 1))
        stamp = store.db.one('SELECT description FROM schema_migrations WHERE version = 1')[0]
        assert 'stamped' in stamp
        assert store.api_key('k') == ('alice', b'\x01', b'\x02')
        assert store.training_run('r', 'alice').lora_config == {'lora': {'rank': 4}}
        assert store.checkpoint('r', 'weights/a', 'alice').size_bytes == 3
    finally:
        store.close()


def test_reopening_applies_nothing_twice(url, tmp_path):
    from twinkle_server.store import Store
    from twinkle_server.store.db.migrations import LATEST, applied_versions

    first = Store.open(url, tmp_path)
    first.add_api_key('k', 'alice', b's', b'd')
    first.close()
    again = Store.open(url, tmp_path)
    try:
        assert first.migrated == list(range(1, LATEST + 1)) and again.migrated == []
        assert applied_versions(again.db) == list(range(1, LATEST + 1)) and again.api_key('k') is not None
    finally:
        again.close()


def test_fronts_starting_at_once_migrate_once(url, tmp_path):
    from twinkle_server.store import Store
    from twinkle_server.store.db.migrations import LATEST, applied_versions

    stores, errors, go = [], [], threading.Barrier(4)

    def open_one() -> None:
        go.wait()
        try:
            stores.append(Store.open(url, tmp_path))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert sorted(v for s in stores for v in s.migrated) == list(range(1, LATEST + 1))
        assert applied_versions(stores[0].db) == list(range(1, LATEST + 1))
    finally:
        for s in stores:
            s.close()


def test_a_front_opening_while_another_holds_the_sqlite_lock_waits_for_it(tmp_path):
    """Opening waits out another connection's lock for longer than sqlite3's default 5 s (a front migrating on a
    loaded machine); before the busy timeout was set at connect, switching the file to WAL failed at once."""
    from twinkle_server.store import Store

    path = tmp_path / 'server.db'
    holder = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    holder.execute('CREATE TABLE IF NOT EXISTS held (x INTEGER)')
    holder.execute('BEGIN EXCLUSIVE')
    release = threading.Timer(6.0, lambda: holder.execute('COMMIT'))
    release.start()
    t0 = time.monotonic()
    try:
        store = Store.open(f'sqlite:///{path}', tmp_path)
    finally:
        release.join()
        holder.close()
    try:
        assert time.monotonic() - t0 >= 5.5 and store.migrated  # it waited for the lock, then migrated
    finally:
        store.close()


def test_newer_schema_is_refused_and_failed_migration_rolled_back(url, tmp_path):
    from twinkle_server.store.db import DatabaseError, open_database
    from twinkle_server.store.db.migrations import MIGRATIONS, Migration, applied_versions, migrate

    db = open_database(url, tmp_path)
    try:
        migrate(db)
        broken = MIGRATIONS + (Migration(99, 'broken', ('CREATE TABLE half_done (a {INT})', 'NOT SQL AT ALL')),)
        with pytest.raises(DatabaseError, match='migrating the metadata database'):
            migrate(db, broken)
        assert 99 not in applied_versions(db)
        with db.transaction() as s:
            assert not db.has_table(s, 'half_done')
        db.execute('INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)', (99, time.time()))
        with pytest.raises(DatabaseError, match='schema version 99, newer than this twinkle-server'):
            migrate(db)
    finally:
        db.close()


# ---- URLs and errors ------------------------------------------------------------------------------------------------
def test_bad_and_unreachable_urls_fail_clearly_without_the_password(tmp_path):
    from twinkle_server.launch import free_port
    from twinkle_server.store import Store
    from twinkle_server.store.db import DatabaseError, mask_url

    assert (
        mask_url('postgresql://u:s3cret@h:5/db?password=x&sslmode=require')
        == 'postgresql://u:***@h:5/db?password=***&sslmode=require'
    )
    for bad, why in (
        ('mysql://u@h/db', 'unsupported database URL'),
        ('postgresql://u:s3cret@h:port/db', 'invalid'),
        ('postgresql://u:s3cret@h:5432', 'name the database'),
        ('sqlite://', 'names a file'),
    ):
        with pytest.raises(DatabaseError, match=why) as err:
            Store.open(bad, tmp_path)
        assert 's3cret' not in str(err.value)
    pytest.importorskip('psycopg')
    url = f'postgresql://twinkle:s3cret@127.0.0.1:{free_port()}/twinkle'
    with pytest.raises(DatabaseError, match='cannot connect to the metadata database') as err:
        Store.open(url, tmp_path)
    assert 's3cret' not in str(err.value) and 'twinkle:***@127.0.0.1' in str(err.value)


def test_sqlite_url_names_the_file(tmp_path):
    from twinkle_server.store import Store

    store = Store.open(f'sqlite:///{tmp_path}/elsewhere/meta.db', tmp_path / 'data')
    store.add_api_key('k', 'alice', b's', b'd')
    store.close()
    assert (tmp_path / 'elsewhere' / 'meta.db').is_file() and not (tmp_path / 'data' / 'server.db').exists()


def test_keys_cli_takes_a_database_url(postgres_url, tmp_path, capsys):
    from twinkle_core.cli.main import main
    from twinkle_server.store import Store

    assert (
        main(
            [
                'server',
                'keys',
                'create',
                '--tenant',
                'carol',
                '--data-dir',
                str(tmp_path),
                '--database-url',
                postgres_url,
            ]
        )
        == 0
    )
    key = capsys.readouterr().out.strip()
    store = Store.open(postgres_url, tmp_path)
    try:
        assert key.startswith('tml-') and store.tenants() == ['carol']
    finally:
        store.close()
    assert (
        main(
            [
                'server',
                'keys',
                'revoke',
                '--tenant',
                'carol',
                '--data-dir',
                str(tmp_path),
                '--database-url',
                postgres_url,
            ]
        )
        == 0
    )
    assert 'revoked 1 key' in capsys.readouterr().out
    assert (
        main(
            [
                'server',
                'keys',
                'create',
                '--tenant',
                'carol',
                '--data-dir',
                str(tmp_path),
                '--database-url',
                'postgresql://x:pw@127.0.0.1:1/none',
            ]
        )
        == 2
    )
    assert 'cannot connect' in capsys.readouterr().err


# ---- a PostgreSQL-backed server restarts without losing runs --------------------------------------------------------
def test_postgres_backed_server_restarts_without_losing_runs(postgres_url, tmp_path, tiny_model_dir, sft_data):
    import tinker
    from tinker import types

    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key
    from twinkle_server.store import Store

    def start():
        config = ServerConfig(
            models={MODEL: str(tiny_model_dir)}, data_dir=str(tmp_path), port=free_port(), database_url=postgres_url
        )
        return start_in_thread(config)

    store = Store.open(postgres_url, tmp_path)
    key = create_api_key(store, 'dana')
    store.close()
    running = start()
    try:
        assert running.service.store.url == postgres_url and not (tmp_path / 'server.db').exists()
        svc = tinker.ServiceClient(base_url=running.base_url, api_key=key)
        tc = svc.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result()
        tc.forward_backward(sft_data, 'cross_entropy').result()
        tc.optim_step(types.AdamParams(learning_rate=5e-3)).result()
        path = tc.save_state('after-step-1').result().path
        expected = tc.forward(sft_data, 'cross_entropy').result().metrics['loss:sum']
    finally:
        running.stop()

    running = start()
    try:
        rest = tinker.RestClient(base_url=running.base_url, api_key=key)
        assert tc.model_id in {r.training_run_id for r in rest.list_training_runs().result().training_runs}
        assert path in {c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
        svc = tinker.ServiceClient(base_url=running.base_url, api_key=key)
        resumed = svc.create_training_client_from_state_with_optimizer(path).result()
        assert resumed.forward(sft_data, 'cross_entropy').result().metrics['loss:sum'] == pytest.approx(
            expected, rel=1e-5
        )
    finally:
        running.stop()


def test_start_refuses_an_unreachable_database_before_loading_anything(tmp_path, tiny_model_dir):
    import shutil
    import subprocess
    import sys

    twinkle = shutil.which('twinkle', path=str(Path(sys.executable).parent)) or 'twinkle'
    done = subprocess.run(
        [
            twinkle,
            'server',
            'start',
            '--model',
            str(tiny_model_dir),
            '--data-dir',
            str(tmp_path),
            '--database-url',
            'postgresql://u:secret@127.0.0.1:1/db',
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert 'cannot connect to the metadata database postgresql://u:***@127.0.0.1:1/db' in done.stderr
    assert 'secret' not in done.stderr
