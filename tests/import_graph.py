"""The import graph of this project's packages, read from the sources with `ast` (what the layering tests check).

Imports count at module level AND inside functions (and under ``if TYPE_CHECKING``): an import moved into a function
is still a dependency, so hiding one there to dodge a cycle does not pass. Importing ``a.b.c`` first runs the
package ``a.b`` (its ``__init__``), so that package is a dependency too, except a module's own packages and its own
top-level package (``twinkle_core`` itself is imported by every module of it).
"""

from __future__ import annotations

import ast
from pathlib import Path


def package_modules(package: str, root: Path) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package at `root` (named `package`)."""
    out = {}
    for path in sorted(root.rglob('*.py')):
        parts = [package, *path.relative_to(root).with_suffix('').parts]
        if parts[-1] == '__init__':
            parts.pop()
        out['.'.join(parts)] = path
    return out


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Every module of `known` that `module` (source `path`) imports, with the packages that importing them runs,
    except `module`'s own packages and its own top-level package."""
    is_package = path.name == '__init__.py'
    package = module if is_package else module.rpartition('.')[0]
    own_root = module.split('.')[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')[: len(package.split('.')) - node.level + 1]
                base = '.'.join(anchor + ([node.module] if node.module else []))
            targets = [base] + [f'{base}.{alias.name}' for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split('.')
            for i in range(1, len(parts) + 1):
                name = '.'.join(parts[:i])
                if name in known and name not in (module, own_root) and not module.startswith(name + '.'):
                    found.add(name)
    return found


def graph_of(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of `modules` it imports."""
    known = set(modules)
    return {m: imports_of(m, p, known) for m, p in modules.items()}


Layers = list[tuple[str, tuple[str, ...]]]


def layer_index(module: str, package: str, layers: Layers) -> int:
    """The index in `layers` (lowest first: (name, module prefixes relative to `package`)) of the layer whose
    longest prefix `module` starts with; AssertionError for a module in no layer."""
    relative = module.removeprefix(package).removeprefix('.')
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if relative == prefix or (prefix and relative.startswith(prefix + '.')):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    if best is None:
        raise AssertionError(f'{module} is in no layer: add it to the layers of its layering test.')
    return best[1]


def upward_imports(graph: dict[str, set[str]], package: str, layers: Layers) -> list[str]:
    """Every import of `graph` from a lower layer into a higher one, as readable lines."""
    return [
        f'{m} ({layers[layer_index(m, package, layers)][0]}) imports {d} ({layers[layer_index(d, package, layers)][0]})'
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if layer_index(d, package, layers) > layer_index(m, package, layers)
    ]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _import_targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement names (for ``from a import b``: ``a`` and ``a.b``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ''
    if node.level:
        package = module if is_package else module.rpartition('.')[0]
        anchor = package.split('.')[: len(package.split('.')) - node.level + 1]
        base = '.'.join(anchor + ([node.module] if node.module else []))
    return [base] + [f'{base}.{alias.name}' for alias in node.names]


def module_level_imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: outside functions and ``if TYPE_CHECKING`` blocks."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If) and 'TYPE_CHECKING' not in ast.unparse(node.test):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(ast.parse(path.read_text(encoding='utf-8')).body)
    return found


def function_local_imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """The imports inside functions (run when the function is called)."""
    return [
        node
        for fn in ast.walk(ast.parse(path.read_text(encoding='utf-8')))
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(fn)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]


def third_party_at_import(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the top-level names of the third-party packages importing it loads (its module-level imports and
    those of the first-party modules they load, transitively)."""
    direct: dict[str, tuple[set[str], set[str]]] = {}
    for module, path in modules.items():
        first, third = set(), set()
        for node in module_level_imports(path):
            for target in _import_targets(node, module, path.name == '__init__.py'):
                own = deepest_module(target, modules)
                if own:
                    first.add(own) if own != module else None
                elif not target.startswith('twinkle'):
                    third.add(target.split('.')[0])
        direct[module] = (first, third)
    out: dict[str, set[str]] = {}
    for module in modules:
        seen, stack, found = set(), [module], set()
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            first, third = direct[current]
            found |= third
            stack.extend(first)
            parent = current.rpartition('.')[0]
            if parent in modules:  # importing a submodule runs its package first
                stack.append(parent)
        out[module] = found
    return out


def deepest_module(target: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of dotted `target` that is a module of `modules` (None: not first-party)."""
    parts = target.split('.')
    for i in range(len(parts), 0, -1):
        name = '.'.join(parts[:i])
        if name in modules:
            return name
    return None


def local_first_party_imports(modules: dict[str, Path]) -> list[tuple[str, int, str]]:
    """(importing module, line, imported first-party module) of every function-local import of a first-party
    module (for ``from a import b``: ``a.b`` when it is a module, else ``a``)."""
    out = []
    for module, path in modules.items():
        for node in function_local_imports(path):
            targets = _import_targets(node, module, path.name == '__init__.py')
            names = targets[1:] if isinstance(node, ast.ImportFrom) else targets
            for name in names:
                own = deepest_module(name, modules)
                if own and own != module:
                    out.append((module, node.lineno, own))
    return sorted(set(out))
