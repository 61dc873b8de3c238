"""A throwaway third-party plugin distribution, pip-installed into this venv for the module and removed after:
its loss resolves by name, `twinkle plugins list` shows it, and its broken parts stay contained."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest
from core_helpers import run_python, run_twinkle

SUFFIX = uuid.uuid4().hex[:8]
DIST = f'twinkle-tp-{SUFFIX}'
PKG = f'twinkle_tp_{SUFFIX}'

FILES = {
    'pyproject.toml': f'''
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{DIST}"
        version = "0.0.1"

        [tool.setuptools]
        packages = ["{PKG}"]

        [project.entry-points."twinkle.loss"]
        ThatLoss = "{PKG}.losses:ThatLoss"
        BrokenLoss = "{PKG}.broken:BrokenLoss"

        [project.entry-points."twinkle.hooks"]
        tp_cli = "{PKG}.cli"
        tp_broken_import = "{PKG}.broken:Hooks"
        tp_broken_cli = "{PKG}.cli:BrokenCli"
    ''',
    f'{PKG}/__init__.py': '',
    f'{PKG}/losses.py': '''
        from twinkle_core.loss import Loss


        class ThatLoss(Loss):
            """Twice the input, to prove it is this one."""

            def __call__(self, inputs, outputs, **kwargs):
                return {'loss': 2 * inputs['x']}
    ''',
    f'{PKG}/broken.py': """
        raise RuntimeError('this plugin is broken on purpose')
    """,
    f'{PKG}/cli.py': """
        from twinkle_core.hooks import hook


        @hook
        def twinkle_cli(subparsers):
            p = subparsers.add_parser('tp-hello', help='say hello from a plugin')
            p.set_defaults(func=lambda args: print('hello from the plugin') or 0)


        class BrokenCli:
            @hook
            def twinkle_cli(self, subparsers):
                raise RuntimeError('cli hook broken on purpose')
    """,
}


@pytest.fixture(scope='module')
def installed_plugin(tmp_path_factory: pytest.TempPathFactory):
    src = tmp_path_factory.mktemp('plugin')
    for rel, text in FILES.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    pip = [sys.executable, '-m', 'pip', '--disable-pip-version-check', '-q']
    done = subprocess.run(
        [*pip, 'install', '--no-deps', '--no-build-isolation', '--no-index', str(src)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    try:
        yield DIST
    finally:
        subprocess.run([*pip, 'uninstall', '-y', DIST], capture_output=True, timeout=120)
        from twinkle_core import plugins

        plugins.refresh()


def test_resolve_loss_from_installed_plugin(installed_plugin) -> None:
    out = run_python("""
        from twinkle_core import resolve
        loss = resolve('loss', 'ThatLoss')
        print(type(loss).__module__, loss({'x': 21}, {})['loss'])
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [f'{PKG}.losses', '42']


def test_resolve_in_process_after_refresh(installed_plugin) -> None:
    from twinkle_core import plugins, resolve

    plugins.refresh()
    assert resolve('loss', 'ThatLoss')({'x': 1}, {}) == {'loss': 2}


def test_broken_entry_point_raises_plugin_load_error(installed_plugin) -> None:
    from twinkle_core import plugins, resolve
    from twinkle_core.errors import PluginLoadError

    plugins.refresh()
    with pytest.raises(PluginLoadError) as info:
        resolve('loss', 'BrokenLoss')
    text = str(info.value)
    assert 'BrokenLoss' in text and installed_plugin in text and 'broken on purpose' in text


def test_plugins_list_shows_plugin_and_survives_broken_ones(installed_plugin) -> None:
    out = run_twinkle('plugins', 'list', '--kind', 'loss')
    assert out.returncode == 0, out.stderr
    rows = {tuple(line.split()[:4]) for line in out.stdout.splitlines()}
    assert ('ThatLoss', 'loss', installed_plugin, 'entry_point') in rows
    assert ('BrokenLoss', 'loss', installed_plugin, 'entry_point') in rows  # listed, never imported
    assert 'Traceback' not in out.stderr
    info = run_twinkle('plugins', 'info', 'BrokenLoss')
    assert info.returncode == 1 and 'failed to import' in info.stderr and 'Traceback' not in info.stderr
    good = run_twinkle('plugins', 'info', 'ThatLoss')
    assert good.returncode == 0 and 'Twice the input' in good.stdout


def test_plugin_cli_subcommand_despite_broken_hook_plugins(installed_plugin) -> None:
    out = run_twinkle('tp-hello')
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'hello from the plugin'
    assert 'tp_broken_import' in out.stderr and 'cli hook broken on purpose' in out.stderr  # reported, skipped
    help_text = run_twinkle('--help')
    assert help_text.returncode == 0 and 'tp-hello' in help_text.stdout
