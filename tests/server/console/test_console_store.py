"""What the console adds to the metadata store (migration 6), on SQLite and PostgreSQL: operator keys, per-step run
metrics (tenant-scoped), pending requests and recent failures; and `twinkle server keys create --admin`."""

from __future__ import annotations

import pytest


@pytest.fixture(params=['sqlite', 'postgres'])
def store(request, tmp_path):
    """A fresh store on each backend (PostgreSQL: a new database on the session's server; skips without one)."""
    from twinkle_server.store import Store

    url = request.getfixturevalue('postgres_url') if request.param == 'postgres' else None
    s = Store.open(url, tmp_path)
    yield s
    s.close()


def test_admin_keys(store):
    store.add_api_key('k-admin', 'ops', b's', b'd', admin=True)
    store.add_api_key('k-user', 'alice', b's', b'd')
    assert store.is_admin_key('k-admin') and not store.is_admin_key('k-user') and not store.is_admin_key('nope')
    store.revoke_api_keys('ops')
    assert not store.is_admin_key('k-admin')


def test_run_metrics_are_per_tenant(store):
    for step in (1, 2, 3):
        store.add_run_metrics('run-a', 'alice', 'forward_backward', step, {'loss:sum': 10.0 / step})
        store.add_run_metrics('run-a', 'alice', 'optim_step', step, {'learning_rate': 1e-3})
    store.add_run_metrics('run-a', 'alice', 'forward_backward', 3, {'loss:sum': 2.0})  # a retried step replaces
    store.add_run_metrics('run-b', 'bob', 'forward_backward', 1, {'loss:sum': 1.0})
    rows = store.run_metrics('run-a', 'alice')
    assert [(op, step) for op, step, _, _ in rows] == [
        ('forward_backward', 1),
        ('optim_step', 1),
        ('forward_backward', 2),
        ('optim_step', 2),
        ('forward_backward', 3),
        ('optim_step', 3),
    ]
    assert rows[4][3] == {'loss:sum': 2.0}
    assert store.run_metrics('run-a', 'bob') == []  # another tenant's run: nothing
    assert store.last_steps('alice') == {'run-a': 3} and store.last_steps('bob') == {'run-b': 1}
    assert len(store.run_metrics('run-a', 'alice', limit=2)) == 2


def test_pending_requests_and_recent_failures(store):
    store.add_future('req-1', 'alice', op='forward_backward', model_id='run-a')
    store.add_future('req-2', 'bob', op='sample')
    store.finish_future('req-2', 'failed', 'application/json', b'{"error": "boom"}')
    assert [r[0] for r in store.pending_requests('alice', 10)] == ['req-1']
    assert store.pending_requests('bob', 10) == []
    (failure,) = store.recent_failures(10)
    assert failure[:3] == ('req-2', 'bob', 'sample') and failure[5] == b'{"error": "boom"}'


def test_keys_create_admin_cli(tmp_path, capsys):
    from twinkle_core.cli.main import main
    from twinkle_server.service.auth import authenticate, split_key
    from twinkle_server.store import Store

    assert main(['server', 'keys', 'create', '--tenant', 'ops', '--admin', '--data-dir', str(tmp_path)]) == 0
    admin = capsys.readouterr().out.strip()
    assert main(['server', 'keys', 'create', '--tenant', 'alice', '--data-dir', str(tmp_path)]) == 0
    plain = capsys.readouterr().out.strip()
    store = Store.open(None, tmp_path)
    try:
        assert authenticate(store, admin).name == 'ops'
        assert store.is_admin_key(split_key(admin)[0]) and not store.is_admin_key(split_key(plain)[0])
    finally:
        store.close()
