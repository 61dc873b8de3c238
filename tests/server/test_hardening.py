"""Operator-facing hardening: limits that merge key by key, private key storage, failed-login throttling, the exact
adapter a native client asks for, file paths confined to allowed roots, the failure hook, bounded memory for an
oversized request, a full disk (507, previous checkpoint intact) and no temporary directories left behind."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
from bounded import small_tmpfs
from raw_http import PROTO, assert_refused, datum, fwdbwd_body, fwdbwd_loss, new_model, optim_step, result
from server_names import MODEL
from tinker import types
from uninstalled_index import index_with_uninstalled


@pytest.fixture()
def http(server, alice):
    with httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': alice}, timeout=60) as client:
        yield client


# ---- limits ------------------------------------------------------------------------------------------------------
def test_limits_file_overrides_only_the_keys_it_names(tmp_path):
    from twinkle_server.config import ServerConfig, TenantLimits

    f = tmp_path / 'limits.json'
    f.write_text(
        json.dumps(
            {'default': {'max_adapters': 3, 'max_num_samples': None}, 'tenants': {'carol': {'max_lora_rank': 16}}}
        )
    )
    default, tenants = ServerConfig.load_limits(str(f))
    builtin = TenantLimits()
    assert default.max_adapters == 3 and default.max_num_samples is None  # null = unlimited
    assert default.max_tokens_per_request == builtin.max_tokens_per_request  # untouched keys keep the defaults
    carol = tenants['carol']
    assert carol.max_lora_rank == 16 and carol.max_adapters == 3 and carol.max_num_samples is None
    assert carol.max_pending_futures == builtin.max_pending_futures
    f.write_text(json.dumps({'tenants': {'carol': {'max_adaptors': 3}}}))
    with pytest.raises(ValueError, match=r"tenants.carol: unknown limit\(s\) \['max_adaptors'\]"):
        ServerConfig.load_limits(str(f))
    f.write_text(json.dumps({'default': {'max_adapters': -1}}))
    with pytest.raises(ValueError, match='max_adapters must be a non-negative integer or null'):
        ServerConfig.load_limits(str(f))


def test_server_cli_refuses_a_bad_limits_file(tmp_path, tiny_model_dir):
    import sys

    f = tmp_path / 'limits.json'
    f.write_text('{"default": {"max_adapters": "many"}}')
    out = subprocess.run(
        [
            sys.executable,
            '-m',
            'twinkle_core.cli.main',
            'server',
            'start',
            '--model',
            f'm={tiny_model_dir}',
            '--data-dir',
            str(tmp_path / 'd'),
            '--limits',
            str(f),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and 'max_adapters must be a non-negative integer' in out.stderr


def test_too_many_sessions_is_a_403_that_is_not_retried(server, http):
    limits = server.service.config.default_limits
    server.service.config.tenant_limits['alice'] = limits.merged({'max_sessions': 0})
    try:
        r = http.post('/create_session', json={'tags': [], 'user_metadata': None, 'sdk_version': 'x'})
        assert_refused(r, 403, 'max_sessions=0')
    finally:
        server.service.config.tenant_limits.pop('alice')


# ---- key storage and logins ----------------------------------------------------------------------------------------
def test_database_files_holding_key_hashes_are_private(server):
    files = [f for f in server.data_dir.iterdir() if f.name.startswith('server.db')]
    assert files and {f.name for f in files} >= {'server.db'}
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_repeated_failed_logins_from_one_address_are_throttled(server, alice):
    svc = server.service
    old = svc.logins.max_per_minute
    svc.logins.max_per_minute = 3
    svc.logins.reset()  # the shared server's window may hold failed logins of tests run before (another file)
    try:
        with httpx.Client(base_url=server.base_url + '/api/v1', timeout=30) as anon:
            codes = [
                anon.get('/get_server_capabilities', headers={'X-API-Key': f'tml-{i:012d}wrong'}).status_code
                for i in range(4)
            ]
            assert codes == [401, 401, 401, 429]
            r = anon.get('/get_server_capabilities', headers={'X-API-Key': 'tml-000000000009wrong'})
            assert r.status_code == 429 and 'too many failed logins' in r.json()['error']
            assert int(r.headers['retry-after']) >= 1
            # someone else's guesses never lock out a valid key (tests/server/test_hardening_transport.py)
            assert anon.get('/get_server_capabilities', headers={'X-API-Key': alice}).status_code == 200
    finally:
        svc.logins.max_per_minute = old
        svc.logins.reset()
    with httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': alice}, timeout=30) as ok:
        assert ok.get('/get_server_capabilities').status_code == 200


# ---- native API: exact adapters, confined paths ----------------------------------------------------------------------
@pytest.fixture(scope='module')
def native_client(server, alice):
    from twinkle_client import init_twinkle_client

    client = init_twinkle_client(base_url=server.base_url, api_key=alice)
    yield client
    client.close()


def test_native_adapter_gets_exactly_the_requested_alpha_and_targets(native_client):
    from twinkle_client import MultiLoraTransformersModel

    model = MultiLoraTransformersModel(model_id=MODEL)
    model.add_adapter_to_model('exact', {'r': 4, 'lora_alpha': 7, 'target_modules': ['q_proj', 'v_proj']})
    config = model.get_train_configs(adapter_name='exact')
    assert config['adapter']['r'] == 4 and config['adapter']['lora_alpha'] == 7
    assert sorted(config['adapter']['target_modules']) == ['q_proj', 'v_proj']
    model.add_adapter_to_model('defaults', {'r': 2})  # what peft does locally: lora_alpha 8, all linear layers
    config = model.get_train_configs(adapter_name='defaults')
    assert config['adapter']['lora_alpha'] == 8 and config['adapted_modules'] > 2 * 2


def test_native_paths_must_stay_inside_the_model_or_an_allowed_root(server, native_client, tmp_path):
    from twinkle_client import MultiLoraTransformersModel
    from twinkle_core.errors import TwinkleError

    model = MultiLoraTransformersModel(model_id=MODEL)
    model.add_adapter_to_model('paths', {'r': 2})
    model.set_template(
        'Template', model_id_or_tokenizer=str(server.model_dir), adapter_name='paths'
    )  # its own directory
    copy = tmp_path / 'tokenizer-copy'
    subprocess.run(['cp', '-r', str(server.model_dir), str(copy)], check=True)
    with pytest.raises(TwinkleError, match='inside the hosted model'):
        model.set_template('Template', model_id_or_tokenizer=str(copy), adapter_name='paths')
    server.service.config.allowed_roots = (str(tmp_path),)
    try:
        model.set_template('Template', model_id_or_tokenizer=str(copy), adapter_name='paths')  # an allow-listed root
    finally:
        server.service.config.allowed_roots = ()


# ---- failures: hook, memory, disk ----------------------------------------------------------------------------------
def test_failed_server_work_fires_the_failure_hook(server, http):
    from twinkle_core.hooks import hook, register_hooks, unregister_hooks

    class Recorder:
        def __init__(self):
            self.calls = []

        @hook
        def twinkle_failure(self, exc, context):
            self.calls.append((exc, context))

    recorder = Recorder()
    register_hooks(recorder)
    try:
        _, model_id = new_model(http, MODEL)
        bad = types.Datum(  # a NaN advantage at a loss position: the loss refuses it when the work runs
            model_input=types.ModelInput.from_ints([5, 6, 7]),
            loss_fn_inputs={'target_tokens': [6, 7, 8], 'logprobs': [-1.0] * 3, 'advantages': [1.0, math.nan, 1.0]},
        )
        r = http.post(
            '/forward_backward', content=fwdbwd_body(model_id, 1, [bad], 'importance_sampling'), headers=PROTO
        )
        failed = result(http, r.json()['request_id'])
        assert 'advantages' in failed['error'] and failed['category'] == 'user'
    finally:
        unregister_hooks(recorder)
    server_calls = [ctx for _, ctx in recorder.calls if ctx.get('where') == 'server']
    assert server_calls and server_calls[-1]['model_id'] == model_id and server_calls[-1]['seq_id'] == 1
    assert server_calls[-1]['kind'] == 'train' and server_calls[-1]['tenant'] == 'alice'


def _peak_rss_kb() -> int:
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith('VmHWM:'):
            return int(line.split()[1])
    raise AssertionError('no VmHWM')


@pytest.mark.skipif(not Path('/proc/self/clear_refs').exists(), reason='needs Linux /proc to reset the RSS peak')
def test_an_oversized_request_is_refused_with_bounded_memory(server, http):
    """256 rows x 1000 tokens (the request that grew a server to 20 GiB): refused by max_tokens_per_request before
    anything is decoded. Bound: the server's (this process's) peak RSS grows by less than 200 MiB."""
    _, model_id = new_model(http, MODEL)
    body = fwdbwd_body(model_id, 1, [datum(1000)] * 256)  # ~4 MB on the wire, built before measuring
    config = server.service.config
    old, config.max_body_bytes = config.max_body_bytes, 64 * 1024 * 1024  # the production default
    try:
        Path('/proc/self/clear_refs').write_text('5')  # reset the peak to the current RSS
        before = _peak_rss_kb()
        r = http.post('/forward_backward', content=body, headers=PROTO)
        grew_mib = (_peak_rss_kb() - before) / 1024
    finally:
        config.max_body_bytes = old
    assert_refused(r, 413, 'max_tokens_per_request=32768')
    assert grew_mib < 200, f'peak RSS grew by {grew_mib:.0f} MiB'
    assert fwdbwd_loss(http, model_id, 2) > 0  # and the model still trains


@pytest.fixture()
def small_disk(tmp_path):
    """A 16 MiB tmpfs (root only: skipped where mounting is not allowed)."""
    with small_tmpfs(tmp_path, 16) as mnt:
        yield mnt


def test_disk_full_during_save_answers_507_and_keeps_the_previous_checkpoint(server, small_disk):
    from twinkle_server import ServerConfig, start_in_thread
    from twinkle_server.launch import free_port
    from twinkle_server.service.auth import create_api_key

    config = ServerConfig(models={MODEL: str(server.model_dir)}, data_dir=str(small_disk / 'data'), port=free_port())
    other = start_in_thread(config, hosts=server.service.hosts)  # the same engine, data on the small disk
    try:
        key = create_api_key(other.service.store, 'alice')
        with httpx.Client(base_url=other.base_url + '/api/v1', headers={'X-API-Key': key}, timeout=60) as h:
            _, model_id = new_model(h, MODEL, rank=16)
            fwdbwd_loss(h, model_id, 1)
            optim_step(h, model_id, 2)
            first = result(
                h, h.post('/save_weights', json={'model_id': model_id, 'seq_id': 3, 'path': 'ck'}).json()['request_id']
            )
            assert first['path'].endswith('/weights/ck'), first
            ck_dir = next((small_disk / 'data' / 'checkpoints').rglob('weights/ck'))
            before = {f.name: f.read_bytes() for f in ck_dir.iterdir()}
            filler = small_disk / 'filler'
            _fill(filler)  # then give back a little: room for the metadata database, not for a checkpoint
            os.truncate(filler, filler.stat().st_size - min(96 * 1024, sum(map(len, before.values())) // 3))
            fwdbwd_loss(h, model_id, 4)
            optim_step(h, model_id, 5)
            failed = result(
                h, h.post('/save_weights', json={'model_id': model_id, 'seq_id': 6, 'path': 'ck'}).json()['request_id']
            )
            assert failed.get('status') == 507 and 'out of disk space' in failed['error'], failed
            assert {f.name: f.read_bytes() for f in ck_dir.iterdir()} == before  # the previous checkpoint is intact
            leftovers = [p for p in (small_disk / 'data').rglob('*') if p.name.startswith(('.tmp', '.old'))]
            assert leftovers == []
            assert fwdbwd_loss(h, model_id, 7) > 0  # the server keeps serving
            filler.unlink()
            again = result(
                h, h.post('/save_weights', json={'model_id': model_id, 'seq_id': 8, 'path': 'ck'}).json()['request_id']
            )
            assert 'path' in again and again['path'].endswith('/weights/ck'), again
    finally:
        other.stop()


def _fill(path: Path) -> None:
    with open(path, 'wb') as f:
        try:
            while True:
                f.write(b'\0' * (64 * 1024))
                f.flush()
        except OSError:
            pass


def test_interrupted_saves_leave_no_temporary_directories(tmp_path):
    from twinkle_server.store.checkpoint_files import CheckpointFiles

    files = CheckpointFiles(tmp_path)
    run = files.root / 'alice' / 'run-1' / 'weights'
    for stale in (f'.tmp-ck-{uuid.uuid4().hex[:8]}', f'.old-ck-{uuid.uuid4().hex[:8]}'):
        (run / stale).mkdir(parents=True)
        (run / stale / 'adapter_model.safetensors').write_bytes(b'half')
    (run / 'ck').mkdir()
    assert CheckpointFiles(tmp_path).remove_stale() == 0  # the start-up cleaning (in __init__) already ran
    assert [p.name for p in run.iterdir()] == ['ck']

    def failing_fill(directory: str) -> None:
        Path(directory, 'adapter_model.safetensors').write_bytes(b'x')
        raise OSError(28, 'No space left on device')

    with pytest.raises(OSError):
        files.write(run / 'new', failing_fill, {})
    assert [p.name for p in run.iterdir()] == ['ck']


@pytest.mark.parametrize(
    'extra, message',
    [
        (['--sampler', 'NoSuchSampler'], 'NoSuchSampler'),
        (['--sampler-args', '[1]'], '--sampler-args: expected a JSON object'),
        (['--sampler-args', '{oops'], '--sampler-args: not valid JSON'),
        (['--backend', 'NoSuchBackend'], 'NoSuchBackend'),
        (['--backend', 'DeepSpeedModel'], 'pip install twinkle-deepspeed'),  # indexed, never installed
        (['--backend-args', '"x"'], '--backend-args: expected a JSON object'),
    ],
)
def test_server_cli_refuses_a_bad_backend_or_sampler_choice(tmp_path, tiny_model_dir, extra, message):
    import sys

    registry = index_with_uninstalled(tmp_path / 'registry')
    out = subprocess.run(
        [
            sys.executable,
            '-m',
            'twinkle_core.cli.main',
            'server',
            'start',
            '--model',
            f'm={tiny_model_dir}',
            '--data-dir',
            str(tmp_path / 'd'),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, 'TWINKLE_REGISTRY_DIR': str(registry)},
    )
    assert out.returncode == 2 and message in out.stderr
