"""The `twinkle` CLI: plugins list/info, hub hash, the fixtures wiring, and fault tolerance."""

from __future__ import annotations

import json
from pathlib import Path

from core_helpers import run_python, run_twinkle
from uninstalled_index import UNINSTALLED_DIST, UNINSTALLED_KIND, UNINSTALLED_NAME, index_with_uninstalled, installed

from twinkle_core.cli import main as cli


def test_plugins_list_shows_builtins_with_kind_and_distribution(tmp_path: Path) -> None:
    index = index_with_uninstalled(tmp_path / 'registry')  # registry/ plus a made-up, never-installed entry
    out = run_twinkle('plugins', 'list', env={'TWINKLE_REGISTRY_DIR': str(index)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ['NAME', 'KIND', 'PROVIDER', 'SOURCE', 'TARGET']
    rows = {tuple(line.split()[:4]) for line in lines[1:]}
    assert ('local', 'runtime', 'twinkle-core', 'entry_point') in rows
    assert ('jsonl_metrics', 'hooks', 'twinkle-core', 'entry_point') in rows
    assert (UNINSTALLED_NAME, UNINSTALLED_KIND, UNINSTALLED_DIST, 'index') in rows
    # an indexed first-party plugin that is installed is listed from its entry point instead
    megatron_source = 'entry_point' if installed('twinkle-megatron') else 'index'
    assert ('MegatronModel', 'model', 'twinkle-megatron', megatron_source) in rows
    assert ('Qwen3RMSNormFP32', 'patch', 'ms://twinkle-community/qwen3-training-patches', 'index') in rows


def test_plugins_list_filters_and_json() -> None:
    out = run_twinkle('plugins', 'list', '--kind', 'runtime', '--json')
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert {r['kind'] for r in rows} == {'runtime'}
    assert {
        'name': 'local',
        'kind': 'runtime',
        'provider': 'twinkle-core',
        'source': 'entry_point',
        'target': 'twinkle_core.runtime.local:LocalRuntime',
    } in rows
    bad = run_twinkle('plugins', 'list', '--kind', 'losss')
    assert bad.returncode == 1 and "Did you mean 'loss'" in bad.stderr and 'Traceback' not in bad.stderr


def test_plugins_list_imports_no_plugin_and_no_torch() -> None:
    out = run_python("""
        import io, sys, contextlib
        from twinkle_core.cli.main import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(['plugins', 'list']) == 0
        print(sorted(m for m in ('torch', 'transformers', 'twinkle_core.runtime.local', 'twinkle_core.hooks.loggers',
                                 'pluggy') if m in sys.modules))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '[]'


def test_plugins_info(tmp_path: Path) -> None:
    out = run_twinkle('plugins', 'info', 'local', '--kind', 'runtime')
    assert out.returncode == 0, out.stderr
    assert 'kind: runtime' in out.stdout and 'provider: twinkle-core' in out.stdout
    assert 'object: twinkle_core.runtime.local.LocalRuntime' in out.stdout and 'signature:' in out.stdout
    index = index_with_uninstalled(tmp_path / 'registry')
    missing = run_twinkle('plugins', 'info', UNINSTALLED_NAME, env={'TWINKLE_REGISTRY_DIR': str(index)})
    assert missing.returncode == 1 and f'pip install {UNINSTALLED_DIST}' in missing.stderr
    assert 'Traceback' not in missing.stderr
    unknown = run_twinkle('plugins', 'info', 'NoSuchThing')
    assert unknown.returncode == 1 and 'twinkle plugins list' in unknown.stderr


def test_help_and_fixtures_wiring() -> None:
    out = run_twinkle()
    assert out.returncode == 0 and all(c in out.stdout for c in ('plugins', 'hub', 'fixtures'))
    fixtures = run_twinkle('fixtures', 'tiny-model', '--help')
    assert fixtures.returncode == 0, fixtures.stderr
    assert '--size' in fixtures.stdout


def test_a_broken_core_command_does_not_break_the_cli(monkeypatch, capsys) -> None:
    monkeypatch.setattr(cli, 'COMMANDS', cli.COMMANDS + [cli.Command('broken', 'no_such_module_xyz:add', 'x')])
    assert cli.main(['broken']) == 1
    assert '`twinkle broken` is unavailable' in capsys.readouterr().err
    assert cli.main(['plugins', 'list', '--kind', 'runtime']) == 0
    assert 'local' in capsys.readouterr().out


def test_core_command_is_a_one_liner(monkeypatch, capsys) -> None:
    import argparse
    import sys
    import types

    module = types.ModuleType('_twinkle_test_cmd')

    def add(subparsers: argparse._SubParsersAction) -> None:
        p = subparsers.add_parser('hello')
        p.add_argument('who')
        p.set_defaults(func=lambda args: print(f'hello {args.who}') or 0)

    module.add = add
    monkeypatch.setitem(sys.modules, '_twinkle_test_cmd', module)
    monkeypatch.setattr(cli, 'COMMANDS', cli.COMMANDS + [cli.Command('hello', '_twinkle_test_cmd:add', 'greet')])
    assert cli.main(['hello', 'world']) == 0
    assert capsys.readouterr().out.strip() == 'hello world'
