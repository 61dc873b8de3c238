"""A full disk stops only what needs disk: a real tmpfs data_dir filled to 0 bytes free, two `tinker` SDK tenants.

While it is full, sessions, new training clients, training steps, heartbeats and sampling keep working (their
metadata waits in memory); a checkpoint save is refused 507 (retryable: the SDK retries it) without dropping the
keep-alive connection. Once space is freed the waiting metadata reaches the database by itself, the retried save
succeeds, and a restarted server sees what was created while the disk was full.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import tinker
from bounded import small_tmpfs, within
from server_names import MODEL
from tinker import types

ADAM = types.AdamParams(learning_rate=5e-3)
BOUND_S = 60  # any SDK call that needs longer is stuck (e.g. retrying a 500 for minutes)


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs: the metadata database and a few tiny-model checkpoints fit, then a filler takes the rest."""
    with small_tmpfs(tmp_path, 64) as mnt:
        yield mnt


def _step(tc: Any, data: list) -> float:
    loss = tc.forward_backward(data, 'cross_entropy').result(timeout=BOUND_S).metrics['loss:sum']
    tc.optim_step(ADAM).result(timeout=BOUND_S)
    return loss


def _fill(disk: Path) -> Path:
    """Write a filler until the disk is full; returns it."""
    filler = disk / 'filler'
    with open(filler, 'wb') as f:
        try:
            while True:
                f.write(b'\0' * (1 << 20))
                f.flush()
        except OSError:
            pass
    assert os.statvfs(disk).f_bavail == 0
    return filler


def _rows(db: Path, sql: str) -> set:
    with sqlite3.connect(f'file:{db}?mode=ro', uri=True) as conn:
        return {r[0] for r in conn.execute(sql)}


def _local_port(r: httpx.Response) -> int:
    """The client-side port of the connection that carried `r` (the same port: the same keep-alive connection)."""
    return r.extensions['network_stream'].get_extra_info('client_addr')[1]


@pytest.mark.timeout(900)
def test_a_full_disk_refuses_only_saves_and_recovers_by_itself(small_disk, tiny_model_dir, sft_data, tokenizer):
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    data_dir = small_disk / 'data'
    config = ServerConfig(models={MODEL: str(tiny_model_dir)}, data_dir=str(data_dir), port=free_port())
    running = start_in_thread(config)
    try:
        keys = {t: create_api_key(running.service.store, t) for t in ('alice', 'bob')}
        alice = tinker.ServiceClient(base_url=running.base_url, api_key=keys['alice'])
        bob = tinker.ServiceClient(base_url=running.base_url, api_key=keys['bob'])
        tc_a = alice.create_lora_training_client(base_model=MODEL, rank=4, seed=0).result(timeout=BOUND_S)
        tc_b = bob.create_lora_training_client(base_model=MODEL, rank=4, seed=1).result(timeout=BOUND_S)
        _step(tc_a, sft_data)
        _step(tc_b, sft_data)
        sampler_path = tc_a.save_weights_for_sampler('s0').result(timeout=BOUND_S).path

        filler = _fill(small_disk)
        # ---- the disk is full: everything that needs no new file keeps working, for both tenants ----
        bob2 = tinker.ServiceClient(base_url=running.base_url, api_key=keys['bob'])  # a new session
        tc_b2 = within(
            BOUND_S,
            lambda: bob2.create_lora_training_client(base_model=MODEL, rank=4, seed=2).result(),
            'a new training client (create_session + create_model) on a full disk',
        )
        for tc in (tc_b2, tc_b, tc_a):
            assert (
                within(BOUND_S, lambda tc=tc: _step(tc, sft_data), 'forward_backward + optim_step on a full disk') > 0
            )
        prompt = types.ModelInput.from_ints(tokenizer.encode('User: Who are you?\nAssistant:'))
        params = types.SamplingParams(max_tokens=4, seed=0)
        for make in (
            lambda: alice.create_sampling_client(model_path=sampler_path),
            lambda: bob2.create_sampling_client(base_model=MODEL),
        ):
            res = within(
                BOUND_S,
                lambda make=make: make().result().sample(prompt, num_samples=2, sampling_params=params).result(),
                'sampling on a full disk',
            )
            assert len(res.sequences) == 2

        with httpx.Client(
            base_url=running.base_url + '/api/v1', headers={'X-API-Key': keys['bob']}, timeout=BOUND_S
        ) as http:
            made = http.post('/create_session', json={'tags': [], 'user_metadata': None, 'sdk_version': 'raw'})
            assert made.status_code == 200, made.text
            refused = http.post('/save_weights', json={'model_id': tc_b.model_id, 'path': 'full'})
            assert refused.status_code == 507, refused.text
            assert refused.headers['x-should-retry'] == 'true' and int(refused.headers['retry-after']) >= 1
            assert 'disk' in refused.json()['error'] and refused.headers.get('connection') != 'close'
            after = http.post('/session_heartbeat', json={'session_id': made.json()['session_id']})
            assert after.status_code == 200, after.text
            assert _local_port(made) == _local_port(refused) == _local_port(after)  # never a dropped connection
            metrics = http.get(running.base_url + '/metrics').text
        assert 'route="/api/v1/save_weights",status="507"' in metrics
        db = data_dir / 'server.db'
        session_b2 = tc_b2.model_id.split(':train:')[0]
        assert session_b2 not in _rows(db, 'SELECT session_id FROM sessions')  # it waits in memory
        waiting_save = tc_a.save_state('during')  # the SDK retries the 507 until there is room
        with pytest.raises(TimeoutError):
            waiting_save.result(timeout=5)

        # ---- space returns: the waiting metadata is written, saves succeed, all without a restart ----
        filler.unlink()
        during = waiting_save.result(timeout=BOUND_S)  # the SDK's retry of the 507 gets through
        assert during.path.endswith('/weights/during')
        assert tc_b.save_state('after').result(timeout=BOUND_S).path.endswith('/weights/after')
        deadline = time.monotonic() + 30
        while session_b2 not in _rows(db, 'SELECT session_id FROM sessions') and time.monotonic() < deadline:
            time.sleep(0.5)
        assert {session_b2, made.json()['session_id']} <= _rows(db, 'SELECT session_id FROM sessions')
        assert tc_b2.model_id in _rows(db, 'SELECT run_id FROM training_runs')
        assert len(_rows(db, 'SELECT sampling_session_id FROM sampling_sessions')) >= 2
        assert 'pending' not in _rows(db, 'SELECT state FROM futures')
    finally:
        running.stop()

    # ---- a restart on the same data_dir sees what was created while the disk was full ----
    running = start_in_thread(config)
    try:
        rest = tinker.RestClient(base_url=running.base_url, api_key=keys['bob'])
        runs = {r.training_run_id for r in rest.list_training_runs().result(timeout=BOUND_S).training_runs}
        assert {tc_b.model_id, tc_b2.model_id} <= runs
        alice_rest = tinker.RestClient(base_url=running.base_url, api_key=keys['alice'])
        paths = {c.tinker_path for c in alice_rest.list_checkpoints(tc_a.model_id).result(timeout=BOUND_S).checkpoints}
        assert during.path in paths
    finally:
        running.stop()


def test_the_store_keeps_refused_writes_in_order_and_writes_them_once_when_space_returns(small_disk):
    """The write-behind itself: reads see waiting writes, bad writes still fail at once, heartbeats take one slot,
    the bound answers 507, and the background retry writes everything, in order, once space is freed."""
    from twinkle_server.errors import as_api_error
    from twinkle_server.store import Store
    from twinkle_server.store.db.writebehind import BacklogFull

    store = Store(small_disk / 'data', write_behind=True)
    try:
        store.add_session('s1', 'alice', [], None)
        filler = _fill(small_disk)
        cli = Store(small_disk / 'data')  # a CLI's store (no write-behind) reports the failure
        try:
            with pytest.raises(sqlite3.OperationalError, match='full'):
                cli.add_api_key('k', 'alice', b's', b'd')
        finally:
            cli.close()
        store.add_session('s2', 'alice', ['new'], None)
        assert store.session_state('s2', 'alice') == 'active' and store.session_state('s2', 'bob') is None
        with pytest.raises(sqlite3.IntegrityError):  # checked against the waiting writes, refused now
            store.add_session('s2', 'alice', [], None)
        store.add_future('req-1', 'alice')
        store.finish_future('req-1', 'done', 'application/json', b'{}')
        for _ in range(50):
            store.touch_session('s1')
        store.finish_session('s2')
        assert store.meta.waiting == 5  # add s2, future added and finished, one heartbeat slot, finish s2
        assert store.session_state('s2', 'alice') == 'finished' and store.future('req-1', 'alice').state == 'done'
        store.meta.limit = store.meta.waiting
        with pytest.raises(BacklogFull) as refused:
            store.add_session('s3', 'alice', [], None)
        err = as_api_error(refused.value)
        assert err.status == 507 and err.headers()['x-should-retry'] == 'true' and 'in memory' in err.message
        db = small_disk / 'data' / 'server.db'
        assert _rows(db, 'SELECT session_id FROM sessions') == {'s1'}

        last_touch = time.time()
        filler.unlink()
        deadline = time.monotonic() + 30
        while store.meta.waiting and time.monotonic() < deadline:  # no write needed: the retry runs by itself
            time.sleep(0.2)
        assert _rows(db, 'SELECT session_id || finished FROM sessions') == {'s10', 's21'}
        assert _rows(db, "SELECT state FROM futures WHERE request_id = 'req-1'") == {'done'}
        assert 0 < last_touch - _rows(db, "SELECT last_seen FROM sessions WHERE session_id = 's1'").pop() < 5
    finally:
        store.close()


def test_a_waiting_write_that_no_longer_applies_is_dropped_not_blocking_the_rest(small_disk, monkeypatch):
    from twinkle_server.store import Store
    from twinkle_server.store.db import writebehind

    monkeypatch.setattr(writebehind, 'FLUSH_EVERY_S', 3600.0)  # only the writes below retry
    store = Store(small_disk / 'data', write_behind=True)
    try:
        filler = _fill(small_disk)
        store.add_api_key('k1', 'alice', b's', b'd')
        store.add_session('s1', 'alice', [], None)
        filler.unlink()
        other = Store(small_disk / 'data')  # another process took the key id meanwhile
        other.add_api_key('k1', 'mallory', b's', b'd')
        other.close()
        store.add_session('s2', 'alice', [], None)  # replays the waiting writes first: k1 fails, s1 goes through
        assert store.meta.waiting == 0 and store.api_key('k1')[0] == 'mallory'
        assert _rows(small_disk / 'data' / 'server.db', 'SELECT session_id FROM sessions') == {'s1', 's2'}
    finally:
        store.close()
