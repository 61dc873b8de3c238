"""The server config file (`twinkle server start --config FILE`, docs/deployment.md): the documented examples
validate, flags override the file, the old-style `ServerConfig` derives the same model table, and a server starts
from the single-process example (bad files: test_config_errors.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from twinkle_server.config import ConfigError, GroupSpec, HubPushConfig, ModelSpec, ServerConfig, load_server_config

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


#: a minimal valid file ('${TINY}': the tiny fixture model)
GOOD = """storage:
  data_dir: ./data
models:
  - name: tiny
    path: ${TINY}
"""


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
    assert sorted(p.name for p in EXAMPLES.glob('*.yaml')) == [
        'ray_multi_node.yaml',
        'ray_one_node.yaml',
        'single_process.yaml',
    ]


def test_the_single_process_example_validates(example_env, tmp_path):
    config = load_server_config(EXAMPLES / 'single_process.yaml')
    assert config.deployment.mode == 'embedded' and config.data_dir == str(tmp_path / 'data')
    assert config.models == {'Qwen/Qwen3-0.6B': str(example_env)}
    spec = config.model_specs['Qwen/Qwen3-0.6B']
    assert (spec.backend, spec.backend_args, spec.sampler, spec.device) == (
        'MultiLoraTransformersModel',
        {'pass_strategy': 'auto'},
        'TorchSampler',
        None,
    )
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
    assert config.hub_push == HubPushConfig(
        enabled=True,
        hub='ms',
        repo_prefix='my-org/twinkle-',
        private=True,
        token_env='MODELSCOPE_API_TOKEN',
        per_request=False,
    )
    small, large = config.model_specs.values()
    assert small.hub_push == config.hub_push and small.train_group.ranks == 1 and small.sampler_replicas == 4
    assert large.hub_push.repo_prefix == 'my-org/qwen3-32b-' and large.hub_push.private is False
    assert large.hub_push.token_env == 'MODELSCOPE_API_TOKEN'  # the rest comes from the server-wide settings
    assert large.mesh_world_size() == 16 and large.sampler_group.num_gpus == 2
    assert large.train_group.device_group('big/train').options == {'resources': {'gpu_80g': 1}}
    assert large.path == 'ms://Qwen/Qwen3-32B'  # a hub id needs no local directory


def test_environment_variables_and_relative_paths(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv('TINY', str(tiny_model_dir))
    monkeypatch.setenv('TWINKLE_TEST_PORT', '9100')
    monkeypatch.delenv('TWINKLE_TEST_UNSET', raising=False)
    (tmp_path / 'conf' / 'roots').mkdir(parents=True)
    path = write(
        tmp_path / 'conf',
        """
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
        """,
    )
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
    path = write(
        tmp_path,
        GOOD
        + """
    backend_args: {pass_strategy: auto, max_length: 512}
  - name: other
    path: ${TINY}
server:
  port: 8001
  max_batch: 4
limits:
  default: {max_adapters: 2}
""",
    )
    (tmp_path / 'limits.json').write_text(json.dumps({'tenants': {'alice': {'max_sessions': 3}}}))
    config = config_from_args(
        start_args(
            '--config',
            str(path),
            '--port',
            '9200',
            '--data-dir',
            'cli-data',
            '--backend',
            'TransformersModel',
            '--pass-strategy',
            'mixed',
            '--limits',
            'limits.json',
            '--device',
            'cpu',
        )
    )
    assert (config.port, config.max_batch, config.data_dir) == (9200, 4, str(tmp_path / 'cli-data'))
    assert config.default_limits.max_adapters == 2 and config.limits('alice').max_sessions == 3
    for spec in config.model_specs.values():  # the model flags apply to every model of the file
        assert (spec.backend, spec.device) == ('TransformersModel', 'cpu')
    assert config.model_specs['tiny'].backend_args == {'pass_strategy': 'mixed', 'max_length': 512}
    assert config.model_specs['other'].backend_args == {'pass_strategy': 'mixed'}

    replaced = config_from_args(start_args('--config', str(path), '--model', f'solo={tiny_model_dir}'))
    assert replaced.models == {'solo': str(tiny_model_dir)} and replaced.port == 8001

    with pytest.raises(ConfigError, match=r'^command line: server.port: out of range: 0 \(expected an integer'):
        config_from_args(start_args('--config', str(path), '--port', '0'))


def test_without_a_file_the_flags_work_as_before(tmp_path, tiny_model_dir):
    from twinkle_server.cli import config_from_args

    config = config_from_args(
        start_args(
            '--model',
            f'm={tiny_model_dir}',
            '--data-dir',
            str(tmp_path),
            '--sampler-args',
            '{"a": 1}',
            '--max-body-mb',
            '2',
        )
    )
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
    config = ServerConfig(
        models={'a': '/m/a', 'b': 'ms://org/b'},
        data_dir='d',
        backend='TransformersModel',
        backend_args={'max_length': 64},
        sampler='vLLMSampler',
        sampler_args={'x': 1},
    )
    assert config.model_specs['b'] == ModelSpec(
        'b',
        'ms://org/b',
        backend='TransformersModel',
        backend_args={'max_length': 64},
        sampler='vLLMSampler',
        sampler_args={'x': 1},
    )
    assert config.deployment.mode == 'embedded' and config.hub_push is None and config.database_url is None
    from_specs = ServerConfig(models={}, data_dir='d', model_specs={'a': ModelSpec('a', '/m/a')})
    assert from_specs.models == {'a': '/m/a'}
    with pytest.raises(ValueError, match='models and model_specs name different models'):
        ServerConfig(models={'a': '/other'}, data_dir='d', model_specs={'a': ModelSpec('a', '/m/a')})
    with pytest.raises(ValueError, match=r"model 'a' sets sampler_replicas, which needs deployment.mode: ray"):
        ServerConfig(models={}, data_dir='d', model_specs={'a': ModelSpec('a', '/m/a', sampler_replicas=2)})


def test_build_engines_follows_each_model_spec(monkeypatch):
    import types

    from twinkle_server.config import DeploymentConfig
    from twinkle_server.engine import deployment

    calls = []
    monkeypatch.setattr(deployment, 'load_model_host', lambda name, path, **kw: calls.append((name, path, kw)) or name)
    specs = {
        'a': ModelSpec('a', '/m/a', backend='TransformersModel', device='cpu'),
        'b': ModelSpec('b', '/m/b', sampler='vLLMSampler', sampler_args={'x': 1}),
    }
    config = ServerConfig(models={}, data_dir='d', model_specs=specs)
    assert deployment.build_model_hosts(config, device='cuda:1') == {'a': 'a', 'b': 'b'}
    assert calls == [
        (
            'a',
            '/m/a',
            dict(device='cpu', backend='TransformersModel', backend_args={}, sampler='TorchSampler', sampler_args={}),
        ),
        (
            'b',
            '/m/b',
            dict(
                device='cuda:1',
                backend='MultiLoraTransformersModel',
                backend_args={},
                sampler='vLLMSampler',
                sampler_args={'x': 1},
            ),
        ),
    ]
    ray_config = ServerConfig(models={}, data_dir='d', model_specs=specs, deployment=DeploymentConfig(mode='ray'))
    fake = types.ModuleType('twinkle_server.engine.ray_deploy')
    fake.build_ray_model_hosts = lambda cfg: {'ray': cfg}
    monkeypatch.setitem(sys.modules, 'twinkle_server.engine.ray_deploy', fake)
    assert deployment.build_model_hosts(ray_config) == {'ray': ray_config}


# ---- a real start ---------------------------------------------------------------------------------------------------
def test_a_server_starts_from_the_single_process_example(tmp_path, tiny_model_dir):
    from twinkle_server.launch import free_port, start_process
    from twinkle_server.service.auth import create_api_key
    from twinkle_server.store import Store

    data_dir, port = tmp_path / 'data', free_port()
    store = Store(str(data_dir))
    key = create_api_key(store, 'alice')
    store.close()
    # the file names the model; --data-dir and --port (start_process adds them) override the file's values
    proc = start_process(
        {},
        str(data_dir),
        port,
        extra_args=('--config', str(EXAMPLES / 'single_process.yaml')),
        env={'TWINKLE_EXAMPLE_MODEL': str(tiny_model_dir), 'TWINKLE_DATA_DIR': os.devnull},
    )
    try:
        request = urllib.request.Request(
            f'http://127.0.0.1:{port}/api/v1/get_server_capabilities', headers={'X-API-Key': key}
        )
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
    placed = placed_by_groups(
        config,
        [
            DeviceGroup(name='model', ranks=1, device_type='cpu'),
            DeviceGroup(name='sampler', ranks=3, device_type='cpu'),
        ],
    )
    spec = placed.model_specs['tiny']
    assert placed.deployment.mode == 'ray' and spec.sampler_replicas == 3 and spec.train_group.device_type == 'cpu'
    assert placed_by_groups(config, []) is config
    with pytest.raises(InvalidInputError, match='no role in a server'):
        placed_by_groups(config, [DeviceGroup(name='actors', ranks=1)])
    # the Twinkle documents' model group of several ranks: the multi-tenant backend trains data-parallel on them
    assert placed_by_groups(config, [DeviceGroup(name='model', ranks=2)]).model_specs['tiny'].train_group.ranks == 2
    monkeypatch.delenv('TWINKLE_SERVER_CONFIG', raising=False)
    with pytest.raises(InvalidInputError, match='TWINKLE_SERVER_CONFIG'):
        ServerRuntime().start(groups=[])


# ---- malformed files: the same line-numbered error from `config check` and `start` ----------------------------------
BOMB = ''.join(
    [f'x0: &x0 [{", ".join(["lol"] * 10)}]\n']
    + [f'x{i}: &x{i} [{", ".join([f"*x{i - 1}"] * 10)}]\n' for i in range(1, 9)]
)
MALFORMED = {
    'an alias inside its own list': (
        GOOD + 'server: {allowed_roots: &a [*a, *a]}\n',
        ':6: server.allowed_roots[0]: an alias refers to a value that contains it',
    ),
    'an alias inside its own mapping': (
        GOOD + 'limits: &l {default: *l}\n',
        ':6: limits.default: an alias refers to a value that contains it',
    ),
    'a mapping merged into itself': (
        GOOD + 'limits: &l {<<: *l}\n',
        ':6: limits: a merge key (<<) refers to a mapping that contains it',
    ),
    'an alias bomb': (GOOD + BOMB, ':10: x4: the file expands to more than 100000 values'),
    'nested too deeply': (
        GOOD + 'limits: ' + '[' * 100 + ']' * 100 + '\n',
        ':6: limits: nested more than 64 levels deep',
    ),
    'nested past the parser': (
        GOOD + 'limits: ' + '[' * 2000 + ']' * 2000 + '\n',
        ':6: not valid YAML: nested more than 64 levels deep',
    ),
    'an unterminated ${': (
        'server: {host: "${UNTERMINATED"}\n' + GOOD,
        ":1: server.host: unterminated ${ in '${UNTERMINATED' (expected ${NAME} or "
        '${NAME:-default}; $${ for a literal ${)',
    ),
    'an unset variable in a default that is used': (
        GOOD.replace('./data', '${TWINKLE_TEST_UNSET:-${TWINKLE_TEST_UNSET_2}}'),
        ':2: storage.data_dir: environment variable TWINKLE_TEST_UNSET_2 is not set',
    ),
    'an unsupported form': (
        'server: {host: "${HOST-x}"}\n' + GOOD,
        ":1: server.host: unsupported reference ${HOST-x} in '${HOST-x}'",
    ),
    'an empty reference': ('server: {host: "a${}b"}\n' + GOOD, ':1: server.host: unsupported reference ${}'),
}


def malformed_commands(path: Path) -> list[list[str]]:
    """Every command that reads a config file, on `path`."""
    from twinkle_server.launch import free_port

    return [
        ['config', 'check', str(path)],
        ['start', '--config', str(path), '--port', str(free_port())],
        ['keys', 'create', '--tenant', 'alice', '--config', str(path)],
    ]


@pytest.mark.parametrize('case', list(MALFORMED))
def test_a_malformed_file_is_a_line_numbered_error_of_check_and_start(
    case, tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """Recursive aliases were a RecursionError traceback, `${A:-${B}}` and `${UNTERMINATED` were taken literally
    (`start` made a directory named `${B}`): each is now `FILE:LINE: key: problem`, exit 2, from every command
    that reads the file. In process (`twinkle_core.cli.main`: an uncaught exception fails the test); the installed
    executable, as a user runs it, is the next test's."""
    from twinkle_core.cli.main import main

    text, expected = MALFORMED[case]
    path = write(tmp_path, text)
    for name in [k for k in os.environ if k.startswith('TWINKLE_TEST_UNSET')]:
        monkeypatch.delenv(name)
    monkeypatch.setenv('TINY', str(tiny_model_dir))
    for command in malformed_commands(path):
        try:
            code = main(['server', *command])
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2, (command, err[-2000:])
        assert f'{path}{expected}' in err, (command, err[-2000:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ['server.yaml']  # nothing was created


def test_the_executable_reports_a_malformed_file_without_a_traceback(tmp_path, tiny_model_dir):
    text, expected = MALFORMED['an alias bomb']
    path = write(tmp_path, text)
    env = {**os.environ, 'TINY': str(tiny_model_dir)}
    for command in malformed_commands(path):
        done = subprocess.run([str(TWINKLE), 'server', *command], capture_output=True, text=True, env=env, timeout=60)
        assert (done.returncode, 'Traceback' in done.stderr) == (2, False), (command, done.stderr[-2000:])
        assert f'{path}{expected}' in done.stderr, (command, done.stderr[-2000:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ['server.yaml']


def test_nested_defaults_merge_keys_and_literal_dollar_braces(tmp_path, monkeypatch, tiny_model_dir):
    """A default may hold references (read only when used); `$${` is a literal `${`; `<<: *anchor` merges with the
    mapping's own keys winning (they were refused as duplicate keys)."""
    monkeypatch.setenv('TINY', str(tiny_model_dir))
    monkeypatch.setenv('TWINKLE_TEST_SET', 'from-env')
    monkeypatch.delenv('TWINKLE_TEST_UNSET', raising=False)
    path = write(
        tmp_path,
        """
        server:
          host: ${TWINKLE_TEST_SET:-${TWINKLE_TEST_UNSET}}    # the default is not read: no error
        storage:
          data_dir: ${TWINKLE_TEST_UNSET:-${TWINKLE_TEST_UNSET:-./x}}
        limits:
          default: &base {max_adapters: 4, max_sessions: 2}
          tenants:
            alice: {max_sessions: 9, <<: *base}   # its own keys win, wherever the merge is
        models:
          - name: "$${NOT_A_VARIABLE}"
            path: ${TINY}
        """,
    )
    config = load_server_config(path)
    assert (config.host, config.data_dir) == ('from-env', str(tmp_path / 'x'))
    assert (config.limits('alice').max_adapters, config.limits('alice').max_sessions) == (4, 9)
    assert list(config.models) == ['${NOT_A_VARIABLE}']


# ---- every command the examples and docs give ------------------------------------------------------------------------
TWINKLE = Path(sys.executable).parent / 'twinkle'


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) of each `twinkle ...` line in the examples' comments and in the docs' shell blocks about
    them, without its trailing comment."""
    found = [
        (p.name, m)
        for p in sorted(EXAMPLES.glob('*.yaml'))
        for m in re.findall(r'^#\s+(twinkle .*)$', p.read_text(), re.M)
    ]
    for doc in sorted(DOCS.parent.glob('*.md')):
        for block in re.findall(r'```(?:bash|sh)\n(.*?)```', doc.read_text(), re.S):
            if 'examples/deploy/' in block:
                found += [(doc.name, line) for line in block.splitlines() if line.startswith('twinkle ')]
    return [(where, re.sub(r'\s+#\s.*$', '', command).strip()) for where, command in found]


def test_every_documented_command_works(tmp_path, tiny_model_dir):
    """`keys create --config FILE` in single_process.yaml's comment failed (keys took only --data-dir): every
    `twinkle` command the examples and docs/deployment.md give runs as written (`start` lines: their flags parse;
    a real start: test_a_server_starts_from_the_single_process_example)."""
    from twinkle_core.cli.main import build_parser

    commands = documented_commands()
    assert any('config check' in c for _, c in commands) and any(
        'keys create' in c and '--config' in c for _, c in commands
    )
    (tmp_path / 'examples').symlink_to(EXAMPLES.parent)  # commands name examples/deploy/... from the checkout
    data = tmp_path / 'data'
    env = {
        **os.environ,
        'PATH': f'{TWINKLE.parent}{os.pathsep}{os.environ["PATH"]}',
        'TWINKLE_DATA_DIR': str(data),
        'TWINKLE_EXAMPLE_MODEL': str(tiny_model_dir),
        'TWINKLE_EXAMPLE_MODEL_2': str(tiny_model_dir),
    }
    created, first_place = 0, {}
    for where, command in commands:
        first_place.setdefault(command, where)  # a command several files give runs once
    for command, where in first_place.items():
        if 'ray_' in command and not HAS_RAY:
            continue
        if command.startswith('twinkle server start'):
            argv = re.sub(r'\[.*?\]', '', command).split()[1:]
            build_parser(argv).parse_args(argv)  # exits 2 on an unknown flag
            continue
        done = subprocess.run(
            ['bash', '-c', command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (where, command, done.stderr[-2000:])
        if ' keys create ' in command:
            assert done.stdout.startswith('tml-'), (where, command, done.stdout)
            created += 1
    revoke = subprocess.run(
        [str(TWINKLE), 'server', 'keys', 'revoke', '--tenant', 'alice', '--data-dir', str(data)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert revoke.stdout.strip() == f"revoked {created} key(s) of tenant 'alice'"  # all went to TWINKLE_DATA_DIR
