"""The core's import graph is acyclic and layered (docs/architecture.md, "Layers").

Imports are read from the sources with `ast`, at module level AND inside functions: an import moved into a
function still is a dependency, so hiding one there to dodge a cycle does not pass. Importing ``a.b.c`` first runs
the package ``a.b`` (its ``__init__``), so that package is a dependency too (except for a module inside it).

A module may import its own layer or lower ones. Lower layers reach a component (an upper layer) only through
``"module:attr"`` targets -- entry points, `kinds.KIND_INTERFACES`, `kinds.KIND_HUB_LOADERS` -- never by importing it.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

import pytest

from tests.import_graph import cycles, graph_of, imports_of, package_modules, upward_imports

CORE = Path(__file__).resolve().parents[2] / 'twinkle_core'

# Lowest first. A module's layer is that of its longest prefix listed here (names relative to twinkle_core).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # -- the interface layer --
    ('foundation', ('errors', 'kinds', 'types', 'utils', 'mesh', 'dispatch', 'plugins')),
    ('index and hub', ('registry_index', 'hub')),
    ('registry', ('registry', '_lazy')),
    ('runtime and hooks', ('runtime', 'hooks')),
    (
        'kind interfaces',
        (
            'model.base',
            'model.step_errors',
            'sampler.base',
            'sampler.prompts',  # the seeding contract `Sampler.sample` splits calls by (foundation imports only)
            'loss.base',
            'advantage.base',
            'reward.base',
            'metric.base',
            'template.base',
            'preprocessor.base',
            'processor.base',
            'patch.base',
            'kernel.base',
            'weight_sync.base',
            'tool',
            'tool.base',
            'env',
            'env.base',
            'eval.task',
        ),
    ),
    # -- above it --
    (
        'components',
        (
            'model',
            'sampler',
            'loss',
            'advantage',
            'reward',
            'metric',
            'template',
            'preprocessor',
            'processor',
            'patch',
            'kernel',
            'weight_sync',
            'dataset',
            'lr_scheduler',
            'optimizer',
            'tool.decorator',
            'eval',
        ),
    ),
    ('training machinery', ('train', 'rl')),
    (
        'compatibility aliases',
        (
            'compat',
            'data_format',
            'dataloader',
            'server',
            'preprocessor.llm',
            'checkpoint_engine',
        ),
    ),
    ('package root and tools', ('', 'cli', 'fixtures', 'console')),
]


@functools.cache
def import_graph() -> dict[str, set[str]]:
    return graph_of(package_modules('twinkle_core', CORE))


def test_the_core_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert {'twinkle_core.registry', 'twinkle_core.hub.loader', 'twinkle_core.kernel.layer'} <= set(graph)
    assert cycles(graph) == []


def test_lower_layers_never_import_upper_ones() -> None:
    assert upward_imports(import_graph(), 'twinkle_core', LAYERS) == []


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / 'm.py'
    source.write_text('def f():\n    from twinkle_core.registry import resolve\n    return resolve\n')
    assert imports_of('twinkle_core.x', source, {'twinkle_core.registry'}) == {'twinkle_core.registry'}
    assert cycles({'a': {'b'}, 'b': {'a'}, 'c': set()}) == [['a', 'b']]


@pytest.mark.parametrize('alias', sorted(importlib.import_module('twinkle_core.compat').ALIAS_MODULES))
def test_alias_modules_are_thin_reexports(alias: str) -> None:
    """Each alias module (`twinkle_core.compat.ALIAS_MODULES`) has a one-line docstring, defines nothing, and
    re-exports the very objects of the module holding the code."""
    target = importlib.import_module('twinkle_core.compat').ALIAS_MODULES[alias]
    path = package_modules('twinkle_core', CORE)[alias]
    tree = ast.parse(path.read_text(encoding='utf-8'))
    doc = ast.get_docstring(tree) or ''
    assert doc and '\n' not in doc, f'{alias}: a one-line docstring naming the path it serves'
    assert not [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    module, code = importlib.import_module(alias), importlib.import_module(target)
    assert module.__all__
    for name in module.__all__:
        assert getattr(module, name) is getattr(code, name), f'{alias}.{name}'


def test_every_module_attr_target_of_the_core_imports() -> None:
    """The targets the lower layers reach components by (the core's entry points in pyproject.toml, the kinds'
    interfaces and hub loaders) name importable objects: a module moved without its target breaks lookup."""
    import tomllib

    from twinkle_core import kinds
    from twinkle_core.plugins import import_target

    project = tomllib.loads((CORE.parent / 'pyproject.toml').read_text(encoding='utf-8'))['project']
    targets = [t for group in project['entry-points'].values() for t in group.values()]
    targets += [*kinds.KIND_INTERFACES.values(), *kinds.KIND_HUB_LOADERS.values()]
    assert all(import_target(t) is not None for t in targets)
