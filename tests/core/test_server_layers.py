"""The server's layers (docs/architecture.md, "The server's layers"): `api/` -> `service/` -> `engine/` -> `store/`,
over the foundation (errors, logs, metrics, the config declaration), under the application modules that assemble
them. A module imports its own layer or lower ones (the same `ast` reader as the core's test: inside functions and
under ``if TYPE_CHECKING`` too), and the package root holds only the application and foundation modules."""

from __future__ import annotations

import functools
from pathlib import Path

from tests.import_graph import cycles, graph_of, package_modules, upward_imports

SERVER = Path(__file__).resolve().parents[2] / 'plugins' / 'server' / 'twinkle_server'

# Lowest first. A module's layer is that of its longest prefix listed here (names relative to twinkle_server).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        'foundation',
        (
            'asgi',
            'errors',
            'logs',
            'metrics',
            'config',
            'config.rules',
            'config.options',
            'config.model_settings',
            'config.settings',
            'config.schema',
            'config.yaml_lines',
        ),
    ),
    ('store', ('store',)),  # the metadata store, its tables and databases, checkpoint files
    ('engine', ('engine',)),  # model hosts, the scheduler, the Ray deployment, loss programs
    ('service', ('service',)),  # the rules: sessions, models, futures, quotas, checkpoints, drain
    ('api', ('api',)),  # the wire: Tinker, OpenAI, native routes, the console, middleware
    # what assembles the layers (the app, the CLI, launching) and the import paths kept as aliases
    (
        'application',
        ('', 'app', 'cli', 'launch', 'runtime', 'config.loading', 'config.model_checks', 'config_file', 'auth'),
    ),
]
ROOT_MODULES = {
    '__init__',
    'app',
    'asgi',
    'auth',
    'cli',
    'config_file',
    'errors',
    'launch',
    'logs',
    'metrics',
    'runtime',
}
ROOT_PACKAGES = {'api', 'config', 'engine', 'service', 'store'}


@functools.cache
def server_graph() -> dict[str, set[str]]:
    return graph_of(package_modules('twinkle_server', SERVER))


def test_the_package_root_holds_only_the_application_and_the_foundation() -> None:
    modules = {p.stem for p in SERVER.glob('*.py')}
    packages = {p.name for p in SERVER.iterdir() if p.is_dir() and (p / '__init__.py').exists()}
    assert (modules, packages) == (ROOT_MODULES, ROOT_PACKAGES)


def test_the_server_has_no_import_cycle() -> None:
    assert cycles(server_graph()) == []


def test_lower_layers_never_import_upper_ones() -> None:
    assert upward_imports(server_graph(), 'twinkle_server', LAYERS) == []


def test_the_checker_reports_an_import_up_a_layer() -> None:
    graph = {'twinkle_server.store.rows': {'twinkle_server.api.deps'}, 'twinkle_server.api.deps': set()}
    assert upward_imports(graph, 'twinkle_server', LAYERS) == [
        'twinkle_server.store.rows (store) imports twinkle_server.api.deps (api)'
    ]
