"""The server config file (`twinkle server start --config FILE`, docs/deployment.md): the documented examples
validate, bad files are refused with every problem named by file, line and key, flags override the file, the
old-style `ServerConfig` derives the same model table, and a server starts from the single-process example."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from twinkle_server.config import GroupSpec, HubPushConfig, ModelSpec, ServerConfig
from twinkle_server.config_file import ConfigError, load_server_config

EXAMPLES = Path(__file__).resolve().parents[2] / 'examples' / 'deploy'
DOCS = Path(__file__).resolve().parents[2] / 'docs' / 'deployment.md'
HAS_RAY = importlib.util.find_spec('twinkle_ray') is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason='deployment.mode: ray needs twinkle-ray')


@pytest.fixture
def example_env(monkeypatch, tmp_path, tiny_model_dir):
    """The substitutions the examples document: real model directories and a data directory."""
    monkeypatch.setenv('TWINKLE_EXAMPLE_MODEL', str(tiny_model_dir))
    monkeypatch.setenv('TWINKLE_EXAMPLE_MODEL_2', str(tiny_model_dir))
    monkeypatch.setenv('TWINKLE_DATA_DIR', str(tmp_path / 'data'))
    return tiny_model_dir


def write(tmp_path: Path, text: str, name: str = 'server.yaml') -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip('\n'))
    return path


def errors_of(path: Path, overrides: dict | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_server_config(path, overrides)
    return info.value.errors


# ---- the documented examples ---------------------------------------------------------------------------------------
def test_there_is_one_example_per_deployment_shape():
    assert sorted(p.name for p in EXAMPLES.glob('*.yaml')) == ['ray_multi_node.yaml', 'ray_one_node.yaml',
                                                               'single_process.yaml']


def test_the_single_process_example_validates(example_env, tmp_path):
    config = load_server_config(EXAMPLES / 'single_process.yaml')
    assert config.deployment.mode == 'embedded' and config.data_dir == str(tmp_path / 'data')
    assert config.models == {'Qwen/Qwen3-0.6B': str(example_env)}
    spec = config.model_specs['Qwen/Qwen3-0.6B']
    assert (spec.backend, spec.backend_args, spec.sampler, spec.device) == (
        'MultiLoraTransformersModel', {'pass_strategy': 'auto'}, 'TorchSampler', None)
    assert config.port == 8000 and config.max_body_bytes == 64 * 1024 * 1024 and config.session_ttl_s == 1800
    assert config.default_limits.max_adapters == 8 and config.limits('alice').max_lora_rank == 64
    assert config.limits('alice').max_adapters == 8  # a tenant's entry overrides only the keys it names


@needs_ray
def test_the_ray_one_node_example_validates(example_env):
    config = load_server_config(EXAMPLES / 'ray_one_node.yaml')
    assert config.deployment.mode == 'ray' and config.deployment.ray.address is None
    assert config.deployment.ray.num_cpus == 16 and len(config.model_specs) == 2
    first, second = config.model_specs.values()
    assert first.train_group == GroupSpec(ranks=1, device_type='cuda', num_cpus=2, num_gpus=1)
    assert first.sampler_replicas == 2 and first.sampler_group == GroupSpec(1, 'cuda', None, 1)
    assert second.backend == 'TransformersModel' and second.mesh == {'fsdp_size': 2}
    assert second.mesh_world_size() == second.train_group.ranks == 2


@needs_ray
def test_the_ray_multi_node_example_validates(example_env, monkeypatch):
    monkeypatch.delenv('TWINKLE_EXAMPLE_MODEL_2')  # the second model keeps its default, a hub id
    config = load_server_config(EXAMPLES / 'ray_multi_node.yaml')
    assert config.deployment.ray.address == 'auto' and config.database_url.startswith('postgresql://twinkle:')
    assert config.hub_push == HubPushConfig(enabled=True, hub='ms', repo_prefix='my-org/twinkle-', private=True,
                                            token_env='MODELSCOPE_API_TOKEN', per_request=False)
    small, large = config.model_specs.values()
    assert small.hub_push == config.hub_push and small.train_group.ranks == 1 and small.sampler_replicas == 4
    assert large.hub_push.repo_prefix == 'my-org/qwen3-32b-' and large.hub_push.private is False
    assert large.hub_push.token_env == 'MODELSCOPE_API_TOKEN'  # the rest comes from the server-wide settings
    assert large.mesh_world_size() == 16 and large.sampler_group.num_gpus == 2
    assert large.train_group.device_group('big/train').options == {'resources': {'gpu_80g': 1}}
    assert large.path == 'ms://Qwen/Qwen3-32B'  # a hub id needs no local directory


def test_the_docs_name_every_key():
    from twinkle_server import config_file
    text = DOCS.read_text()
    keys = [*config_file.TOP, *config_file.SERVER, *config_file.STORAGE, *config_file.AUTH, *config_file.DEPLOYMENT,
            *config_file.RAY, *config_file.HUB_PUSH, *config_file.MODEL, *config_file.TRAIN_GROUP,
            *config_file.SAMPLER_GROUP, *config_file.MESH, *config_file.LIMITS]
    assert [k for k in keys if not re.search(rf'`(\w+\.)?{k}`', text)] == []


# ---- bad files ------------------------------------------------------------------------------------------------------
GOOD = '''storage:
  data_dir: ./data
models:
  - name: tiny
    path: ${TINY}
'''
RAY = 'deployment:\n  mode: ray\n'
BAD = {
    'unknown key with a suggestion': (GOOD + 'server:\n  prot: 9000\n', [
        ':7: server.prot: unknown key (did you mean port?)']),
    'unknown top-level key': ('colour: red\n' + GOOD, [
        ':1: colour: unknown key (expected one of: server, storage, auth, limits, deployment, hub_push, models)']),
    'wrong type': (GOOD + 'server:\n  port: "8000x"\n', [
        ":7: server.port: wrong type: got string '8000x' (expected an integer from 1 to 65535)"]),
    'a section of the wrong type': ('server: 8000\n' + GOOD, [
        ':1: server: wrong type: got integer 8000 (expected a mapping with keys host, port, max_body_mb, '
        'long_poll_s, session_ttl_s, seq_gap_timeout_s, max_failed_logins_per_minute, max_queued_samples, '
        'max_batch, allowed_roots, drain_timeout_s)']),
    'negative value': (GOOD + 'server:\n  max_batch: -4\n', [
        ':7: server.max_batch: out of range: -4 (expected an integer >= 1)']),
    'zero ranks': (GOOD + '    train_group: {ranks: 0}\n', [
        ':6: models[0].train_group.ranks: out of range: 0 (expected an integer >= 1)']),
    'duplicate model name': (GOOD + '  - name: tiny\n    path: ${TINY}\n', [
        ":6: models[1].name: duplicate model name 'tiny' (expected each name once; models[0] already has it)"]),
    'unknown backend': (GOOD + '    backend: MultiLoraTransformerModel\n', [
        ":6: models[0].backend: unknown model backend 'MultiLoraTransformerModel'; did you mean "
        'MultiLoraTransformersModel? (expected an installed model backend: ...']),
    'backend of a plugin that is not installed': (GOOD + '    backend: MegatronModel\n', [
        ":6: models[0].backend: model 'MegatronModel' is provided by the distribution 'twinkle-megatron', which is "
        'not installed. Run: pip install twinkle-megatron (expected an installed model backend)']),
    'unknown sampler': (GOOD + '    sampler: NoSampler\n', [":6: models[0].sampler: unknown sampler 'NoSampler'..."]),
    'missing data_dir': ('storage: {}\nmodels:\n  - name: tiny\n    path: ${TINY}\n', [
        ':1: storage.data_dir: missing (expected a directory for metadata and checkpoints)']),
    'missing storage section': ('models:\n  - name: tiny\n    path: ${TINY}\n', [
        ':1: storage.data_dir: missing (expected a directory for metadata and checkpoints)']),
    'missing models': ('storage:\n  data_dir: ./d\n', [
        ':1: models: missing (expected a list of models, each with at least name and path)']),
    'a model without a path': ('storage:\n  data_dir: ./d\nmodels:\n  - name: tiny\n', [
        ':4: models[0].path: missing (expected a model directory or an ms:// / hf:// id)']),
    'a path that does not exist': ('storage:\n  data_dir: ./d\nmodels:\n  - name: tiny\n    path: nowhere\n', [
        ':5: models[0].path: {dir}/nowhere does not exist (expected a local model directory or an ms:// / hf:// id)']),
    'a malformed hub id': ('storage:\n  data_dir: ./d\nmodels:\n  - name: tiny\n    path: ms://just-one\n', [
        ":5: models[0].path: Hub reference 'ms://just-one': 'just-one' is not \"org/repo\"..."]),
    'a bad device': (GOOD + '    device: gpu0\n', [
        ":6: models[0].device: not allowed: 'gpu0' (expected cpu, cuda, cuda:N or null)"]),
    'mesh size differs from the ranks': (RAY + GOOD + '    backend: TransformersModel\n    train_group: {ranks: 2}\n'
                                         '    mesh: {fsdp_size: 4}\n', [
        ':10: models[0].mesh: the mesh spans 4 ranks but train_group.ranks is 2 (expected the product of the mesh '
        'sizes to equal train_group.ranks)']),
    'several ranks for a one-rank backend': (RAY + GOOD + '    train_group: {ranks: 2}\n', [
        ':8: models[0].train_group.ranks: MultiLoraTransformersModel trains on one rank (it takes no device_mesh) '
        '(expected ranks: 1, or a backend that takes a mesh (e.g. TransformersModel, one adapter at a time))']),
    'a sampler replica of several ranks': (RAY + GOOD + '    sampler_group: {ranks_per_replica: 2}\n', [
        ':8: models[0].sampler_group.ranks_per_replica: a sampler replica is one process (expected '
        'ranks_per_replica: 1; give a replica several GPUs with num_gpus instead (e.g. for vLLM '
        'tensor_parallel_size))']),
    'an unknown mesh size': (RAY + GOOD + '    mesh: {fdsp_size: 2}\n', [
        ':8: models[0].mesh.fdsp_size: unknown key (did you mean fsdp_size?)']),
    'ray-only settings in embedded mode': (
        GOOD + '    train_group: {ranks: 2}\n    mesh: {fsdp_size: 2}\n    sampler_replicas: 2\n', [
            ':6: models[0].train_group.ranks: needs deployment.mode: ray (embedded mode runs each model once, in the '
            'server process)',
            ':7: models[0].mesh: needs deployment.mode: ray (embedded mode runs each model once, in the server '
            'process)',
            ':8: models[0].sampler_replicas: needs deployment.mode: ray (embedded mode runs each model once, in the '
            'server process)']),
    'ray resources in embedded mode': (GOOD + '    sampler_group: {num_gpus: 1}\n', [
        ':6: models[0].sampler_group.num_gpus: needs deployment.mode: ray (embedded mode runs each model once, in '
        'the server process)']),
    'a negative resource amount': (RAY + GOOD + '    train_group: {resources: {node_b: -1}}\n', [
        ':8: models[0].train_group.resources.node_b: out of range: -1 (expected a number >= 0)']),
    'device in ray mode': (RAY + GOOD + '    device: cuda\n', [
        ':8: models[0].device: only used with deployment.mode: embedded (in ray mode set train_group.device_type and '
        'sampler_group.device_type)']),
    'num_cpus with a cluster address': (
        'deployment:\n  mode: ray\n  ray: {address: auto, num_cpus: 8}\n' + GOOD, [
            ':3: deployment.ray.num_cpus: only for a Ray instance the server starts (address: null) (a running '
            'cluster has its own resources; leave num_cpus out)']),
    'an unknown mode': ('deployment: {mode: k8s}\n' + GOOD, [
        ":1: deployment.mode: not allowed: 'k8s' (expected one of embedded, ray)"]),
    'bad limits': (GOOD + 'limits:\n  default: {max_adaptors: 3}\n  tenants:\n    bob: {max_lora_rank: -8}\n', [
        ':7: limits.default.max_adaptors: unknown key (did you mean max_adapters?)',
        ':9: limits.tenants.bob.max_lora_rank: out of range: -8 (expected an integer >= 0 or null)']),
    'api keys switched off': (GOOD + 'auth: {api_keys_required: false}\n', [
        ':6: auth.api_keys_required: not supported: false (expected true: every request carries a key from '
        '`twinkle server keys create`)']),
    'hub push without a repository prefix': (GOOD + 'hub_push: {enabled: true, hub: gitlab}\n', [
        ":6: hub_push.hub: not allowed: 'gitlab' (expected one of ms, hf)",
        ":6: hub_push.repo_prefix: missing while pushing is enabled (expected a prefix of the hub repositories, "
        "e.g. 'my-org/twinkle-')"]),
    'a token instead of a variable name': (GOOD + '    hub_push: {token_env: "hf_abc-123"}\n', [
        ":6: models[0].hub_push.token_env: not allowed: 'hf_abc-123' (expected the NAME of an environment variable "
        'holding the token)']),
    'a bad database URL': ('storage:\n  data_dir: ./d\n  database_url: mysql://db/x\nmodels:\n  - name: t\n'
                           '    path: ${TINY}\n', [
        ':3: storage.database_url: unsupported database URL mysql://db/x: expected sqlite:///PATH.db '
        '(sqlite:////ABSOLUTE/PATH.db) or postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME']),
    'an unset environment variable': (GOOD + 'server: {port: "${NO_SUCH_VARIABLE_HERE}"}\n', [
        ':6: server.port: environment variable NO_SUCH_VARIABLE_HERE is not set (set it, or write '
        '${NO_SUCH_VARIABLE_HERE:-default})']),
    'a duplicate key': ('storage:\n  data_dir: ./a\n  data_dir: ./b\nmodels: []\n', [
        ':3: storage.data_dir: duplicate key, first on line 2 (expected each key once per mapping)']),
    'not YAML': ('storage: {data_dir: ./d\nmodels: []\n', [":2: not valid YAML: expected ',' or '}', but got ':'"]),
    'an empty file': ('# nothing here\n', [
        ':1: (top level): the file is empty (expected a mapping with at least storage and models)']),
}


@pytest.mark.parametrize('case', list(BAD))
def test_a_bad_file_is_refused_with_its_line_and_key(case, tmp_path, monkeypatch, tiny_model_dir):
    text, expected = BAD[case]
    if ('mode: ray' in text or 'mode: ray' in case) and not HAS_RAY:
        pytest.skip('deployment.mode: ray needs twinkle-ray')
    monkeypatch.setenv('TINY', str(tiny_model_dir))
    monkeypatch.delenv('NO_SUCH_VARIABLE_HERE', raising=False)
    path = write(tmp_path, text)
    got = errors_of(path)
    assert len(got) == len(expected), got
    for message, want in zip(got, expected):
        want = str(path) + want.replace('{dir}', str(tmp_path))
        if want.endswith('...'):
            assert message[:len(want) - 3] == want[:-3]
        else:
            assert message == want


def test_every_problem_is_reported_at_once_in_line_order(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv('TINY', str(tiny_model_dir))
    path = write(tmp_path, '''
        models:
          - name: tiny
            path: ${TINY}
            sampler_replicas: two
        server: {port: 0, hots: x}
        ''')
    got = [m.split(': ', 2)[1] for m in errors_of(path)]
    assert got == ['storage.data_dir', 'models[0].sampler_replicas', 'server.hots', 'server.port']
    assert str(ConfigError(['a', 'b', 'a'])) == 'a\nb'  # one message per problem, in order


# ---- values: environment, paths ------------------------------------------------------------------------------------
def test_environment_variables_and_relative_paths(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv('TINY', str(tiny_model_dir))
    monkeypatch.setenv('TWINKLE_TEST_PORT', '9100')
    monkeypatch.delenv('TWINKLE_TEST_UNSET', raising=False)
    (tmp_path / 'conf' / 'roots').mkdir(parents=True)
    path = write(tmp_path / 'conf', '''
        server:
          port: ${TWINKLE_TEST_PORT}             # unquoted: read again after expansion, a number
          host: "${TWINKLE_TEST_UNSET:-0.0.0.0}" # the default when unset
          allowed_roots: [roots]
        storage:
          data_dir: data                         # relative to this file's directory
          database_url: sqlite:///meta/server.db
        models:
          - name: "${TWINKLE_TEST_PORT}"          # quoted: stays a string
            path: ${TINY}
        ''')
    config = load_server_config(path)
    conf = tmp_path / 'conf'
    assert (config.port, config.host, list(config.models)) == (9100, '0.0.0.0', ['9100'])
    assert config.data_dir == str(conf / 'data') and config.allowed_roots == (str(conf / 'roots'),)
    assert config.database_url == f'sqlite:///{conf}/meta/server.db'


# ---- flags over the file --------------------------------------------------------------------------------------------
def start_args(*argv: str):
    from twinkle_core.cli.main import build_parser
    return build_parser(['server', 'start', *argv]).parse_args(['server', 'start', *argv])


def test_flags_given_override_the_file(tmp_path, monkeypatch, tiny_model_dir):
    from twinkle_server.cli import config_from_args
    monkeypatch.setenv('TINY', str(tiny_model_dir))
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, GOOD + '''
    backend_args: {pass_strategy: auto, max_length: 512}
  - name: other
    path: ${TINY}
server:
  port: 8001
  max_batch: 4
limits:
  default: {max_adapters: 2}
''')
    (tmp_path / 'limits.json').write_text(json.dumps({'tenants': {'alice': {'max_sessions': 3}}}))
    config = config_from_args(start_args('--config', str(path), '--port', '9200', '--data-dir', 'cli-data',
                                         '--backend', 'TransformersModel', '--pass-strategy', 'mixed',
                                         '--limits', 'limits.json', '--device', 'cpu'))
    assert (config.port, config.max_batch, config.data_dir) == (9200, 4, str(tmp_path / 'cli-data'))
    assert config.default_limits.max_adapters == 2 and config.limits('alice').max_sessions == 3
    for spec in config.model_specs.values():  # the model flags apply to every model of the file
        assert (spec.backend, spec.device) == ('TransformersModel', 'cpu')
    assert config.model_specs['tiny'].backend_args == {'pass_strategy': 'mixed', 'max_length': 512}
    assert config.model_specs['other'].backend_args == {'pass_strategy': 'mixed'}

    replaced = config_from_args(start_args('--config', str(path), '--model', f'solo={tiny_model_dir}'))
    assert replaced.models == {'solo': str(tiny_model_dir)} and replaced.port == 8001

    with pytest.raises(ConfigError, match=r"^command line: server.port: out of range: 0 \(expected an integer"):
        config_from_args(start_args('--config', str(path), '--port', '0'))


def test_without_a_file_the_flags_work_as_before(tmp_path, tiny_model_dir):
    from twinkle_server.cli import config_from_args
    config = config_from_args(start_args('--model', f'm={tiny_model_dir}', '--data-dir', str(tmp_path),
                                         '--sampler-args', '{"a": 1}', '--max-body-mb', '2'))
    assert config.model_specs == {'m': ModelSpec('m', str(tiny_model_dir), sampler_args={'a': 1})}
    assert (config.port, config.host, config.max_body_bytes) == (8000, '127.0.0.1', 2 * 1024 * 1024)
    with pytest.raises(ValueError, match='--model and --data-dir are required'):
        config_from_args(start_args('--data-dir', str(tmp_path)))


# ---- `twinkle server config check` ---------------------------------------------------------------------------------
def test_config_check_exit_codes_and_messages(tmp_path, monkeypatch, capsys, tiny_model_dir):
    from twinkle_core.cli.main import main
    monkeypatch.setenv('TINY', str(tiny_model_dir))
    good = write(tmp_path, GOOD, 'good.yaml')
    assert main(['server', 'config', 'check', str(good)]) == 0
    assert capsys.readouterr().out == f'{good}: OK (1 model: tiny; deployment: embedded)\n'
    bad = write(tmp_path, GOOD + 'server: {port: -1, max_batch: 0}\n', 'bad.yaml')
    assert main(['server', 'config', 'check', str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f'{bad}: 2 errors:\n{bad}:6: server.port: out of range: -1')
    assert f'{bad}:6: server.max_batch: out of range: 0 (expected an integer >= 1)' in err
    assert main(['server', 'config', 'check', str(tmp_path / 'missing.yaml')]) == 2
    assert 'cannot read the file' in capsys.readouterr().err


# ---- one table the engines are built from --------------------------------------------------------------------------
def test_an_old_style_config_derives_its_model_specs():
    config = ServerConfig(models={'a': '/m/a', 'b': 'ms://org/b'}, data_dir='d', backend='TransformersModel',
                          backend_args={'max_length': 64}, sampler='vLLMSampler', sampler_args={'x': 1})
    assert config.model_specs['b'] == ModelSpec('b', 'ms://org/b', backend='TransformersModel',
                                                backend_args={'max_length': 64}, sampler='vLLMSampler',
                                                sampler_args={'x': 1})
    assert config.deployment.mode == 'embedded' and config.hub_push is None and config.database_url is None
    from_specs = ServerConfig(models={}, data_dir='d', model_specs={'a': ModelSpec('a', '/m/a')})
    assert from_specs.models == {'a': '/m/a'}
    with pytest.raises(ValueError, match='models and model_specs name different models'):
        ServerConfig(models={'a': '/other'}, data_dir='d', model_specs={'a': ModelSpec('a', '/m/a')})
    with pytest.raises(ValueError, match=r"model 'a' sets sampler_replicas, which needs deployment.mode: ray"):
        ServerConfig(models={}, data_dir='d', model_specs={'a': ModelSpec('a', '/m/a', sampler_replicas=2)})


def test_build_engines_follows_each_model_spec(monkeypatch):
    import types

    from twinkle_server import deployment
    from twinkle_server.config import DeploymentConfig
    calls = []
    monkeypatch.setattr(deployment, 'load_engine', lambda name, path, **kw: calls.append((name, path, kw)) or name)
    specs = {'a': ModelSpec('a', '/m/a', backend='TransformersModel', device='cpu'),
             'b': ModelSpec('b', '/m/b', sampler='vLLMSampler', sampler_args={'x': 1})}
    config = ServerConfig(models={}, data_dir='d', model_specs=specs)
    assert deployment.build_engines(config, device='cuda:1') == {'a': 'a', 'b': 'b'}
    assert calls == [('a', '/m/a', dict(device='cpu', backend='TransformersModel', backend_args={},
                                        sampler='TorchSampler', sampler_args={})),
                     ('b', '/m/b', dict(device='cuda:1', backend='MultiLoraTransformersModel', backend_args={},
                                        sampler='vLLMSampler', sampler_args={'x': 1}))]
    ray_config = ServerConfig(models={}, data_dir='d', model_specs=specs, deployment=DeploymentConfig(mode='ray'))
    fake = types.ModuleType('twinkle_server.ray_deploy')
    fake.build_ray_engines = lambda cfg: {'ray': cfg}
    monkeypatch.setitem(sys.modules, 'twinkle_server.ray_deploy', fake)
    assert deployment.build_engines(ray_config) == {'ray': ray_config}


# ---- a real start ---------------------------------------------------------------------------------------------------
def test_a_server_starts_from_the_single_process_example(tmp_path, tiny_model_dir):
    from twinkle_server.auth import create_api_key
    from twinkle_server.launch import free_port, start_process
    from twinkle_server.store import Store
    data_dir, port = tmp_path / 'data', free_port()
    store = Store(str(data_dir))
    key = create_api_key(store, 'alice')
    store.close()
    # the file names the model; --data-dir and --port (start_process adds them) override the file's values
    proc = start_process({}, str(data_dir), port, extra_args=('--config', str(EXAMPLES / 'single_process.yaml')),
                         env={'TWINKLE_EXAMPLE_MODEL': str(tiny_model_dir), 'TWINKLE_DATA_DIR': os.devnull})
    try:
        request = urllib.request.Request(f'http://127.0.0.1:{port}/api/v1/get_server_capabilities',
                                         headers={'X-API-Key': key})
        with urllib.request.urlopen(request, timeout=10) as response:
            models = json.load(response)['supported_models']
        assert [m['model_name'] for m in models] == ['Qwen/Qwen3-0.6B']
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_initialize_http_server_groups_place_every_model(tmp_path, tiny_model_dir, monkeypatch):
    """The server side of initialize(mode='http', groups=...): 'model' -> training group, 'sampler' -> replicas."""
    from twinkle_core.errors import InvalidInputError
    from twinkle_core.mesh import DeviceGroup
    from twinkle_server.runtime import ServerRuntime, placed_by_groups
    path = tmp_path / 'server.yaml'
    path.write_text(f'storage: {{data_dir: {tmp_path}}}\nmodels:\n  - name: tiny\n    path: {tiny_model_dir}\n')
    config = load_server_config(path)
    placed = placed_by_groups(config, [DeviceGroup(name='model', ranks=1, device_type='cpu'),
                                       DeviceGroup(name='sampler', ranks=3, device_type='cpu')])
    spec = placed.model_specs['tiny']
    assert placed.deployment.mode == 'ray' and spec.sampler_replicas == 3 and spec.train_group.device_type == 'cpu'
    assert placed_by_groups(config, []) is config
    with pytest.raises(InvalidInputError, match="no role in a server"):
        placed_by_groups(config, [DeviceGroup(name='actors', ranks=1)])
    with pytest.raises(InvalidInputError, match='trains on one rank'):
        placed_by_groups(config, [DeviceGroup(name='model', ranks=2)])
    monkeypatch.delenv('TWINKLE_SERVER_CONFIG', raising=False)
    with pytest.raises(InvalidInputError, match='TWINKLE_SERVER_CONFIG'):
        ServerRuntime().start(groups=[])
