"""Bad server config files are refused with every problem named by file, line and key (docs/deployment.md)."""

from __future__ import annotations

import pytest
from test_config_file import GOOD, HAS_RAY, errors_of, write
from uninstalled_index import index_with_uninstalled

from twinkle_server.config import ConfigError

# ---- bad files ------------------------------------------------------------------------------------------------------
RAY = 'deployment:\n  mode: ray\n'
BAD = {
    'unknown key with a suggestion': (
        GOOD + 'server:\n  prot: 9000\n',
        [':7: server.prot: unknown key (did you mean port?)'],
    ),
    'unknown top-level key': (
        'colour: red\n' + GOOD,
        [':1: colour: unknown key (expected one of: server, storage, auth, limits, deployment, hub_push, models)'],
    ),
    'wrong type': (
        GOOD + 'server:\n  port: "8000x"\n',
        [":7: server.port: wrong type: got string '8000x' (expected an integer from 1 to 65535)"],
    ),
    'a section of the wrong type': (
        'server: 8000\n' + GOOD,
        [
            ':1: server: wrong type: got integer 8000 (expected a mapping with keys host, port, max_body_mb, '
            'long_poll_s, session_ttl_s, seq_gap_timeout_s, drain_timeout_s, max_failed_logins_per_minute, '
            'trusted_proxies, max_queued_samples, max_batch, allowed_roots, image_decode_budget_mb, '
            'min_checkpoint_ttl_s, checkpoint_sweep_s, custom_loss_cost_factor, custom_loss_max_gflop, '
            'custom_loss_time_s, log_format)'
        ],
    ),
    'negative value': (
        GOOD + 'server:\n  max_batch: -4\n',
        [':7: server.max_batch: out of range: -4 (expected an integer >= 1)'],
    ),
    'zero ranks': (
        GOOD + '    train_group: {ranks: 0}\n',
        [':6: models[0].train_group.ranks: out of range: 0 (expected an integer >= 1)'],
    ),
    'duplicate model name': (
        GOOD + '  - name: tiny\n    path: ${TINY}\n',
        [":6: models[1].name: duplicate model name 'tiny' (expected each name once; models[0] already has it)"],
    ),
    'unknown backend': (
        GOOD + '    backend: MultiLoraTransformerModel\n',
        [
            ":6: models[0].backend: unknown model backend 'MultiLoraTransformerModel'; did you mean "
            'MultiLoraTransformersModel? (expected an installed model backend: ...'
        ],
    ),
    'backend of a plugin that is not installed': (
        GOOD + '    backend: DeepSpeedModel\n',
        [  # uninstalled_index
            ":6: models[0].backend: model 'DeepSpeedModel' is provided by the distribution 'twinkle-deepspeed', "
            'which is not installed. Run: pip install twinkle-deepspeed (expected an installed model backend)'
        ],
    ),
    'a value model as the backend': (
        GOOD + '    backend: TransformersValueModel\n',
        [
            ':6: models[0].backend: TransformersValueModel is a values model (a scalar head: a PPO critic or a reward '
            'model), not a causal LM (expected a causal-LM backend the service can train and sample, e.g. '
            'TransformersModel)'
        ],
    ),
    'unknown sampler': (GOOD + '    sampler: NoSampler\n', [":6: models[0].sampler: unknown sampler 'NoSampler'..."]),
    'missing data_dir': (
        'storage: {}\nmodels:\n  - name: tiny\n    path: ${TINY}\n',
        [':1: storage.data_dir: missing (expected a directory for metadata and checkpoints)'],
    ),
    'missing storage section': (
        'models:\n  - name: tiny\n    path: ${TINY}\n',
        [':1: storage.data_dir: missing (expected a directory for metadata and checkpoints)'],
    ),
    'missing models': (
        'storage:\n  data_dir: ./d\n',
        [':1: models: missing (expected a list of models, each with at least name and path)'],
    ),
    'a model without a path': (
        'storage:\n  data_dir: ./d\nmodels:\n  - name: tiny\n',
        [':4: models[0].path: missing (expected a model directory or an ms:// / hf:// id)'],
    ),
    'a path that does not exist': (
        'storage:\n  data_dir: ./d\nmodels:\n  - name: tiny\n    path: nowhere\n',
        [':5: models[0].path: {dir}/nowhere does not exist (expected a local model directory or an ms:// / hf:// id)'],
    ),
    'a malformed hub id': (
        'storage:\n  data_dir: ./d\nmodels:\n  - name: tiny\n    path: ms://just-one\n',
        [":5: models[0].path: Hub reference 'ms://just-one': 'just-one' is not \"org/repo\"..."],
    ),
    'a bad device': (
        GOOD + '    device: gpu0\n',
        [":6: models[0].device: not allowed: 'gpu0' (expected cpu, cuda, cuda:N or null)"],
    ),
    'mesh size differs from the ranks': (
        RAY + GOOD + '    backend: TransformersModel\n    train_group: {ranks: 2}\n    mesh: {fsdp_size: 4}\n',
        [
            ':10: models[0].mesh: the mesh spans 4 ranks but train_group.ranks is 2 (expected the product of the mesh '
            'sizes to equal train_group.ranks)'
        ],
    ),
    'a mesh dimension the multi-tenant backend does not implement': (
        RAY + GOOD + '    train_group: {ranks: 2}\n    mesh: {tp_size: 2}\n',
        [
            ':9: models[0].mesh: tp_size=2 (tensor parallel) is not implemented by MultiLoraTransformersModel (it '
            'implements: dp_size, fsdp_size); MultiLoraTransformersModel shards its base over fsdp_size and '
            'replicates it over dp_size: use those (expected the mesh dimensions the backend implements)'
        ],
    ),
    'a sampler replica of several ranks': (
        RAY + GOOD + '    sampler_group: {ranks_per_replica: 2}\n',
        [
            ':8: models[0].sampler_group.ranks_per_replica: a sampler replica is one process (expected '
            'ranks_per_replica: 1; give a replica several GPUs with num_gpus instead (e.g. for vLLM '
            'tensor_parallel_size))'
        ],
    ),
    'an unknown mesh size': (
        RAY + GOOD + '    mesh: {fdsp_size: 2}\n',
        [':8: models[0].mesh.fdsp_size: unknown key (did you mean fsdp_size?)'],
    ),
    'ray-only settings in embedded mode': (
        GOOD + '    train_group: {ranks: 2}\n    mesh: {fsdp_size: 2}\n    sampler_replicas: 2\n',
        [
            ':6: models[0].train_group.ranks: needs deployment.mode: ray (embedded mode runs each model once, in the '
            'server process)',
            ':7: models[0].mesh: needs deployment.mode: ray (embedded mode runs each model once, in the server '
            'process)',
            ':8: models[0].sampler_replicas: needs deployment.mode: ray (embedded mode runs each model once, in the '
            'server process)',
        ],
    ),
    'ray resources in embedded mode': (
        GOOD + '    sampler_group: {num_gpus: 1}\n',
        [
            ':6: models[0].sampler_group.num_gpus: needs deployment.mode: ray (embedded mode runs each model once, in '
            'the server process)'
        ],
    ),
    'a negative resource amount': (
        RAY + GOOD + '    train_group: {resources: {node_b: -1}}\n',
        [':8: models[0].train_group.resources.node_b: out of range: -1 (expected a number >= 0)'],
    ),
    'device in ray mode': (
        RAY + GOOD + '    device: cuda\n',
        [
            ':8: models[0].device: only used with deployment.mode: embedded (in ray mode set train_group.device_type '
            'and sampler_group.device_type)'
        ],
    ),
    'num_cpus with a cluster address': (
        'deployment:\n  mode: ray\n  ray: {address: auto, num_cpus: 8}\n' + GOOD,
        [
            ':3: deployment.ray.num_cpus: only for a Ray instance the server starts (address: null) (a running '
            'cluster has its own resources; leave num_cpus out)'
        ],
    ),
    'an unknown mode': (
        'deployment: {mode: k8s}\n' + GOOD,
        [":1: deployment.mode: not allowed: 'k8s' (expected one of embedded, ray)"],
    ),
    'bad limits': (
        GOOD + 'limits:\n  default: {max_adaptors: 3}\n  tenants:\n    bob: {max_lora_rank: -8}\n',
        [
            ':7: limits.default.max_adaptors: unknown key (did you mean max_adapters?)',
            ':9: limits.tenants.bob.max_lora_rank: out of range: -8 (expected an integer >= 0 or null)',
        ],
    ),
    'api keys switched off': (
        GOOD + 'auth: {api_keys_required: false}\n',
        [
            ':6: auth.api_keys_required: not supported: false (expected true: every request carries a key from '
            '`twinkle server keys create`)'
        ],
    ),
    'hub push without a repository prefix': (
        GOOD + 'hub_push: {enabled: true, hub: gitlab}\n',
        [
            ":6: hub_push.hub: not allowed: 'gitlab' (expected one of ms, hf)",
            ':6: hub_push.repo_prefix: missing while pushing is enabled (expected a prefix of the hub repositories, '
            "e.g. 'my-org/twinkle-')",
        ],
    ),
    'a token instead of a variable name': (
        GOOD + '    hub_push: {token_env: "hf_abc-123"}\n',
        [
            ":6: models[0].hub_push.token_env: not allowed: 'hf_abc-123' (expected the NAME of an environment variable "
            'holding the token)'
        ],
    ),
    'a bad database URL': (
        'storage:\n  data_dir: ./d\n  database_url: mysql://db/x\nmodels:\n  - name: t\n    path: ${TINY}\n',
        [
            ':3: storage.database_url: unsupported database URL mysql://db/x: expected sqlite:///PATH.db '
            '(sqlite:////ABSOLUTE/PATH.db) or postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME'
        ],
    ),
    'an unset environment variable': (
        GOOD + 'server: {port: "${NO_SUCH_VARIABLE_HERE}"}\n',
        [
            ':6: server.port: environment variable NO_SUCH_VARIABLE_HERE is not set (set it, or write '
            '${NO_SUCH_VARIABLE_HERE:-default})'
        ],
    ),
    'a duplicate key': (
        'storage:\n  data_dir: ./a\n  data_dir: ./b\nmodels: []\n',
        [':3: storage.data_dir: duplicate key, first on line 2 (expected each key once per mapping)'],
    ),
    'not YAML': ('storage: {data_dir: ./d\nmodels: []\n', [":2: not valid YAML: expected ',' or '}', but got ':'"]),
    'an empty file': (
        '# nothing here\n',
        [':1: (top level): the file is empty (expected a mapping with at least storage and models)'],
    ),
}


@pytest.mark.parametrize('case', list(BAD))
def test_a_bad_file_is_refused_with_its_line_and_key(case, tmp_path, monkeypatch, tiny_model_dir):
    from twinkle_core import registry_index

    text, expected = BAD[case]
    monkeypatch.setenv('TWINKLE_REGISTRY_DIR', str(index_with_uninstalled(tmp_path / 'registry')))
    registry_index.refresh()
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
            assert message[: len(want) - 3] == want[:-3]
        else:
            assert message == want


def test_every_problem_is_reported_at_once_in_line_order(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.setenv('TINY', str(tiny_model_dir))
    path = write(
        tmp_path,
        """
        models:
          - name: tiny
            path: ${TINY}
            sampler_replicas: two
        server: {port: 0, hots: x}
        """,
    )
    got = [m.split(': ', 2)[1] for m in errors_of(path)]
    assert got == ['storage.data_dir', 'models[0].sampler_replicas', 'server.hots', 'server.port']
    assert str(ConfigError(['a', 'b', 'a'])) == 'a\nb'  # one message per problem, in order


# ---- values: environment, paths ------------------------------------------------------------------------------------
