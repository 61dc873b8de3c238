"""Every config key declared once, on its settings field (`twinkle_server.config.options`): the loader's tables, the
`twinkle server start` flags (and their checks without a file) and docs/deployment.md's key tables all come from the
declaration."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from twinkle_server.config import schema
from twinkle_server.config.flags import flag_keys
from twinkle_server.config.flags import markdown_rows as flag_rows
from twinkle_server.config.model_settings import DeploymentConfig, GroupSpec, HubPushConfig, ModelSpec, RayConfig
from twinkle_server.config.options import keys_of, markdown_rows, markdown_table, option, rules_of
from twinkle_server.config.rules import int_rule
from twinkle_server.config.settings import ServerConfig

DOCS = Path(__file__).resolve().parents[2] / 'docs' / 'deployment.md'

TABLES = {
    'server': markdown_table(ServerConfig, 'server'),
    'storage': markdown_table(ServerConfig, 'storage'),
    'deployment': markdown_table(DeploymentConfig) + '\n' + '\n'.join(markdown_rows(RayConfig, prefix='ray.')),
    'hub_push': markdown_table(HubPushConfig),
    'models': markdown_table(ModelSpec),
    'groups': markdown_table(GroupSpec, labels={'ranks': '`ranks` (train) / `ranks_per_replica` (sampler)'}),
}


@pytest.mark.parametrize('section', list(TABLES))
def test_the_docs_key_tables_are_the_declarations(section):
    assert TABLES[section] in DOCS.read_text()


def test_the_docs_flag_table_is_the_declared_flags():
    text = DOCS.read_text()
    assert [row for row in flag_rows() if row not in text] == []
    assert len(flag_rows()) == len({key.option.flag for _, key in flag_keys()}) >= 15


def test_the_docs_name_every_key():
    keys = [
        *schema.TOP,
        *schema.SERVER,
        *schema.STORAGE,
        *schema.AUTH,
        *schema.DEPLOYMENT,
        *schema.RAY,
        *schema.HUB_PUSH,
        *schema.MODEL,
        *schema.TRAIN_GROUP,
        *schema.SAMPLER_GROUP,
        *schema.MESH,
        *schema.LIMITS,
    ]
    text = DOCS.read_text()
    assert [k for k in keys if not re.search(rf'`(\w+\.)?{k}`', text)] == []


def test_one_declaration_makes_a_key_a_rule_a_flag_and_a_docs_row():
    @dataclasses.dataclass
    class Settings:
        retries: int = option(3, section='server', rule=int_rule(0, 9), meaning='how often', flag='--retries')
        size: int = option(2 << 20, section='server', key='size_mb', scale=1 << 20, rule=int_rule(1), meaning='MiB')

    (retries, size) = keys_of(Settings, 'server')
    assert rules_of(Settings, 'server') == {'retries': retries.option.rule, 'size_mb': size.option.rule}
    assert markdown_rows(Settings, 'server') == ['| `retries` | `3` | how often |', '| `size_mb` | `2` | MiB |']
    assert size.to_field(3) == 3 << 20 and Settings().size == 2 << 20
    assert retries.option.rule.problem_with(10) == 'out of range: 10'


def test_the_server_settings_defaults_are_the_declared_ones():
    config = ServerConfig(models={}, data_dir='/d')
    for key in keys_of(ServerConfig, 'server'):
        assert getattr(config, key.field) == key.default


def test_every_declared_flag_is_in_the_help(capsys):
    from twinkle_core.cli.main import main

    with pytest.raises(SystemExit):
        main(['server', 'start', '--help'])
    text = capsys.readouterr().out
    assert [flag for _, key in flag_keys() if (flag := key.option.flag) not in text] == []
    assert '(default 8000; sets server.port of a config file)' in ' '.join(text.split())


@pytest.mark.parametrize(
    ('flag', 'value', 'message'),
    [
        ('--port', '0', '--port: out of range: 0 (an integer from 1 to 65535)'),
        ('--max-body-mb', '0', '--max-body-mb: out of range: 0.0 (a number > 0)'),
        ('--max-failed-logins', '0', '--max-failed-logins: out of range: 0 (an integer >= 1)'),
        ('--device', 'tpu', "--device: not allowed: 'tpu' (cpu, cuda, cuda:N or null)"),
        ('--sampler-args', '[1]', '--sampler-args: expected a JSON object, got list'),
    ],
)
def test_a_flag_without_a_file_is_checked_against_its_key(tmp_path, tiny_model_dir, capsys, flag, value, message):
    from twinkle_core.cli.main import main

    argv = ['server', 'start', '--model', f'm={tiny_model_dir}', '--data-dir', str(tmp_path), flag, value]
    assert main(argv) == 2
    assert capsys.readouterr().err == f'twinkle server start: {message}\n'
    assert not (tmp_path / 'server.db').exists()  # nothing was created


def test_flags_alone_build_the_declared_fields(tmp_path, tiny_model_dir):
    from twinkle_core.cli.main import build_parser
    from twinkle_server.cli import config_from_args

    argv = ['server', 'start', '--model', f'm={tiny_model_dir}', '--data-dir', str(tmp_path)]
    argv += ['--max-body-mb', '2', '--trusted-proxy', '10.0.0.0/8', '--allow-path', str(tmp_path)]
    argv += ['--sampler-args', '{"a": 1}', '--pass-strategy', 'mixed', '--seq-gap-timeout', '5']
    config = config_from_args(build_parser(argv).parse_args(argv))
    assert (config.max_body_bytes, config.trusted_proxies, config.allowed_roots) == (
        2 << 20,
        ('10.0.0.0/8',),
        (str(tmp_path),),
    )
    assert config.seq_gap_timeout_s == 5.0 and config.data_dir == str(tmp_path)
    assert config.model_specs['m'].sampler_args == {'a': 1}
    assert config.model_specs['m'].backend_args == {'pass_strategy': 'mixed'}
