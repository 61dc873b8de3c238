"""The hub manifest ``twinkle.toml``: which components a hub repo holds and where their code is.

Two equivalent forms. One component::

    name = "MyPatch"
    kind = "patch"
    entry = "my_patch:MyPatch"      # module (relative to the repo root, dotted for sub-packages) : attribute
    version = "0.1.0"
    requires = ["transformers>=4.51"]

or several, each a ``[[component]]`` table with the same keys (top-level ``version``/``requires`` are defaults).

A kernel (kind ``kernel``) lives in the ``kernels`` library's layout (``build/<variant>/<package>/layers.py``); its
``entry`` is ``layers:<LayerClass>``, ``replaces`` names the layer it stands in for (a class's
``kernel_layer_name``, e.g. ``RMSNorm``; default: the component's name) and ``decorates`` lists model classes
to tag with that layer name when their library did not (e.g. ``["Qwen3MLP"]``).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from twinkle_core.errors import HubError
from twinkle_core.kinds import KINDS

MANIFEST = 'twinkle.toml'
_ENTRY = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_.]*$')
_KEYS = {'name', 'kind', 'entry', 'version', 'requires', 'description', 'replaces', 'decorates'}


@dataclass(frozen=True)
class ComponentSpec:
    """One component of a hub repo."""

    name: str
    kind: str
    entry: str
    version: str = '0.0.0'
    requires: tuple[str, ...] = ()
    description: str = ''
    replaces: str = ''  # kernels: the layer name replaced (default: `name`)
    decorates: tuple[str, ...] = ()  # kernels: model classes tagged with that layer name

    @property
    def layer_name(self) -> str:
        return self.replaces or self.name

    @property
    def module(self) -> str:
        return self.entry.partition(':')[0]

    @property
    def attr(self) -> str:
        return self.entry.partition(':')[2]


@dataclass(frozen=True)
class Manifest:
    path: Path
    components: tuple[ComponentSpec, ...] = field(default_factory=tuple)

    def select(self, kind: str, name: str | None, where: str) -> ComponentSpec:
        """The component `name` of `kind` (or the only one of that kind when `name` is None)."""
        of_kind = [c for c in self.components if c.kind == kind]
        if name is not None:
            for c in self.components:
                if c.name == name:
                    if c.kind != kind:
                        raise HubError(f'{where}: component {name!r} is a {c.kind}, not a {kind}.')
                    return c
            listed = ', '.join(f'{c.name} ({c.kind})' for c in self.components)
            raise HubError(f'{where}: no component named {name!r} in {MANIFEST}; it lists: {listed}.')
        if len(of_kind) == 1:
            return of_kind[0]
        if not of_kind:
            raise HubError(f'{where}: {MANIFEST} lists no component of kind {kind!r}.')
        raise HubError(
            f'{where} holds several {kind} components ({", ".join(c.name for c in of_kind)}); '
            f'name one with ":Name" at the end of the reference.'
        )


def read_manifest(folder: str | Path) -> Manifest:
    """Parse and validate ``<folder>/twinkle.toml``. Raises `HubError` naming the file and the bad field."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise HubError(f'{folder} has no {MANIFEST}; a hub component repo needs one (see docs/hub.md).')
    try:
        data = tomllib.loads(path.read_text(encoding='utf-8'))
    except tomllib.TOMLDecodeError as exc:
        raise HubError(f'{path} is not valid TOML: {exc}') from exc
    defaults: dict[str, Any] = {k: data[k] for k in ('version', 'requires') if k in data}
    tables = data.get('component')
    if tables is None:
        tables = [{k: v for k, v in data.items() if k != 'component'}]
    elif not isinstance(tables, list) or 'name' in data:
        raise HubError(f'{path}: use either top-level name/kind/entry or [[component]] tables, not both.')
    components = [_component({**defaults, **t}, path, i) for i, t in enumerate(tables)]
    names = [c.name for c in components]
    if len(set(names)) != len(names):
        raise HubError(f'{path}: component names must be unique, got {names}.')
    return Manifest(path, tuple(components))


def _component(table: dict[str, Any], path: Path, index: int) -> ComponentSpec:
    where = f'{path} component #{index}'
    unknown = set(table) - _KEYS
    if unknown:
        raise HubError(f'{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}.')
    for key in ('name', 'kind', 'entry'):
        if not isinstance(table.get(key), str) or not table[key]:
            raise HubError(f'{where}: {key!r} is required and must be a non-empty string.')
    if table['kind'] not in KINDS:
        raise HubError(f'{where}: kind {table["kind"]!r} is not one of {", ".join(KINDS)}.')
    if not _ENTRY.match(table['entry']):
        raise HubError(
            f'{where}: entry {table["entry"]!r} must look like "module:Attr" (module relative to the '
            f'repo root, dotted for sub-packages).'
        )
    requires = table.get('requires', [])
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise HubError(f'{where}: requires must be a list of requirement strings like "transformers>=4.51".')
    replaces, decorates = table.get('replaces', ''), table.get('decorates', [])
    if ('replaces' in table or 'decorates' in table) and table['kind'] != 'kernel':
        raise HubError(f'{where}: "replaces" and "decorates" are for kind "kernel" only.')
    if table['kind'] == 'kernel' and not table['entry'].startswith('layers:'):
        raise HubError(
            f'{where}: a kernel\'s entry is "layers:<LayerClass>" (the class in the kernel package\'s '
            f'layers module), got {table["entry"]!r}.'
        )
    if (
        not isinstance(replaces, str)
        or not isinstance(decorates, list)
        or not all(isinstance(d, str) and d for d in decorates)
    ):
        raise HubError(f'{where}: replaces must be a layer name and decorates a list of class names.')
    return ComponentSpec(
        table['name'],
        table['kind'],
        table['entry'],
        str(table.get('version', '0.0.0')),
        tuple(requires),
        str(table.get('description', '')),
        replaces,
        tuple(decorates),
    )


def check_requirements(spec: ComponentSpec, where: str) -> None:
    """Raise `HubError` with the ``pip install`` line when a requirement of `spec` is missing or too old."""
    from packaging.requirements import InvalidRequirement, Requirement

    missing = []
    for text in spec.requires:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise HubError(f'{where}: requirement {text!r} is malformed: {exc}') from exc
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.append(f'{text} (installed: {version})')
    if missing:
        line = ' '.join(f'"{m.split(" (")[0]}"' for m in missing)
        raise HubError(f'{where} ({spec.name}) needs {", ".join(missing)}. Run: pip install {line}')
