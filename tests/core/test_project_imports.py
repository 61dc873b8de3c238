"""The core, the server and every plugin together (docs/architecture.md, "Layers"): no import cycle anywhere,
function-local imports included; the core imports no plugin; and a plugin imports another first-party package only
when its own pyproject declares that distribution (a dependency, or an extra such as ``twinkle-server[ray]``).
Everything else reaches another plugin's components through the registry, by name."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.import_graph import cycles, graph_of, package_modules

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = {'agentic', 'client', 'megatron', 'ray', 'server', 'transformers', 'vllm'}


def packages() -> dict[str, tuple[Path, Path]]:
    """Top-level package -> (its directory, the pyproject.toml of the distribution that ships it)."""
    found = {'twinkle_core': (ROOT / 'twinkle_core', ROOT / 'pyproject.toml')}
    for pyproject in sorted(ROOT.glob('plugins/*/pyproject.toml')):
        for directory in sorted(pyproject.parent.glob('twinkle_*')):
            if directory.is_dir() and not directory.name.endswith('.egg-info'):  # twinkle_megatron: no __init__
                found[directory.name] = (directory, pyproject)
    return found


def distribution(pyproject: Path) -> tuple[str, set[str]]:
    """(the distribution's name, the distributions it declares: dependencies and every extra's), canonical."""
    project = tomllib.loads(pyproject.read_text(encoding='utf-8'))['project']
    requirements = list(project.get('dependencies', []))
    for extra in project.get('optional-dependencies', {}).values():
        requirements += extra
    return canonicalize_name(project['name']), {canonicalize_name(Requirement(r).name) for r in requirements}


@functools.cache
def project_graph() -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for package, (directory, _) in packages().items():
        modules.update(package_modules(package, directory))
    return graph_of(modules)


def cross_package_imports() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> 'module -> module' lines, for imports between top-level packages
    other than a plugin's imports of the core."""
    found: dict[tuple[str, str], list[str]] = {}
    for module, deps in sorted(project_graph().items()):
        for dep in sorted(deps):
            pair = (module.split('.')[0], dep.split('.')[0])
            if pair[0] != pair[1] and pair[1] != 'twinkle_core':
                found.setdefault(pair, []).append(f'{module} -> {dep}')
    return found


def test_the_graph_covers_the_core_and_every_plugin() -> None:
    assert set(packages()) == {'twinkle_core'} | {f'twinkle_{p}' for p in PLUGINS}
    graph = project_graph()
    assert {'twinkle_server.service.core', 'twinkle_transformers.persistence', 'twinkle_vllm.sampler'} <= set(graph)


def test_no_import_cycle_across_the_core_the_server_and_the_plugins() -> None:
    assert cycles(project_graph()) == []


def test_the_core_imports_no_plugin() -> None:
    assert [lines for (importer, _), lines in cross_package_imports().items() if importer == 'twinkle_core'] == []


def test_a_plugin_imports_another_only_when_its_pyproject_declares_it() -> None:
    owners = packages()
    undeclared = []
    for (importer, imported), lines in cross_package_imports().items():
        _, declared = distribution(owners[importer][1])
        imported_distribution, _ = distribution(owners[imported][1])
        if imported_distribution not in declared:
            undeclared.append(f'{importer} imports {imported} ({imported_distribution} undeclared): {lines}')
    assert undeclared == []


def test_the_checker_sees_another_packages_root_and_type_checking_imports(tmp_path: Path) -> None:
    from tests.import_graph import imports_of

    source = tmp_path / 'm.py'
    source.write_text(
        'from typing import TYPE_CHECKING\nfrom twinkle_ray import RayGroup\n'
        'if TYPE_CHECKING:\n    from twinkle_server.service.core import Service\n'
    )
    known = {'twinkle_ray', 'twinkle_server', 'twinkle_server.service.core'}
    assert imports_of('twinkle_server.x', source, known) == {'twinkle_ray', 'twinkle_server.service.core'}


MAX_LINES = 400


def test_no_source_file_is_over_400_lines() -> None:
    """Small modules with one job (docs/contributing.md): the core, every plugin, the benchmarks, the examples and
    the scripts; tests are not counted."""
    sources = [ROOT / 'twinkle_core', *sorted(ROOT.glob('plugins/*/twinkle_*')), ROOT / 'bench', ROOT / 'examples']
    sources.append(ROOT / 'scripts')
    long = {
        str(path.relative_to(ROOT)): n
        for top in sources
        for path in sorted(top.rglob('*.py'))
        if '.egg-info' not in str(path) and (n := len(path.read_text(encoding='utf-8').splitlines())) > MAX_LINES
    }
    assert long == {}
