"""Reading a config file with positions: YAML (JSON is YAML too) -> plain values plus the line of every key.

- `read_document(path)` -> `Document`: the values (dicts, lists, scalars) and `lines`, which maps each key path
  (e.g. ``('models', 0, 'path')``) to the line it is written on. Duplicate keys are errors, not silently merged.
- String values may use environment variables: ``${VAR}`` (an error when unset) and ``${VAR:-default}`` (the default
  when VAR is unset or empty). An unquoted value is read again after expansion, so ``port: ${PORT:-8000}`` is a
  number; quote it (``"${PORT:-8000}"``) to keep a string.
- `Document.apply(overrides)` lays command-line values over the file: mappings merge key by key, anything else
  replaces; under ``models``, a mapping (not a list) applies to every model entry. Overridden keys have line 0.

Problems are collected as `FILE:LINE: key.path: what is wrong (what is expected)` and raised as one `ConfigError`.
"""
from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KeyPath = tuple[str | int, ...]
COMMAND_LINE = 0  # the "line" of a value given on the command line
_VAR = re.compile(r'\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}')


class ConfigError(ValueError):
    """Every problem found in a config file, one `FILE:LINE: key.path: ...` message per entry of `errors`."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(dict.fromkeys(errors))
        super().__init__('\n'.join(self.errors))


def key_text(path: KeyPath) -> str:
    """``('models', 0, 'mesh')`` -> ``models[0].mesh``; the root is ``(top level)``."""
    out = ''
    for part in path:
        out += f'[{part}]' if isinstance(part, int) else (f'.{part}' if out else part)
    return out or '(top level)'


@dataclass
class Document:
    """A parsed config file: `values` and the `lines` its keys are on (COMMAND_LINE for overrides)."""
    file: str
    values: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def where(self, path: KeyPath) -> str:
        """`FILE:LINE` of `path` (or of its nearest written ancestor, for a missing key), or `command line`."""
        while path not in self.lines and path:
            path = path[:-1]
        line = self.lines.get(path, 1)
        return 'command line' if line == COMMAND_LINE else f'{self.file}:{line}'

    def message(self, path: KeyPath, problem: str, expected: str | None = None, note: str | None = None) -> str:
        """`WHERE: key.path: problem (expected EXPECTED)`, or `(NOTE)` when what to do is not a value."""
        tail = f' (expected {expected})' if expected else f' ({note})' if note else ''
        return f'{self.where(path)}: {key_text(path)}: {problem}{tail}'

    def from_command_line(self, path: KeyPath) -> bool:
        return self.where(path) == 'command line'

    def apply(self, overrides: dict[str, Any] | None) -> None:
        """Lay `overrides` over the values (module docstring); their keys get line COMMAND_LINE."""
        if overrides:
            self.values = self._merge(self.values, overrides, ())

    def _merge(self, value: Any, override: Any, path: KeyPath) -> Any:
        if isinstance(override, dict) and isinstance(value, dict):
            out = dict(value)
            for key, sub in override.items():
                out[key] = self._merge(value.get(key), sub, path + (key,)) if key in value else \
                    self._replace(sub, path + (key,))
            return out
        if path == ('models',) and isinstance(override, dict) and isinstance(value, list):
            return [self._merge(item, override, path + (i,)) for i, item in enumerate(value)]
        return self._replace(override, path)

    def _replace(self, override: Any, path: KeyPath) -> Any:
        for p in [p for p in self.lines if p[:len(path)] == path]:
            del self.lines[p]
        self._mark(override, path)
        return copy.deepcopy(override)

    def _mark(self, value: Any, path: KeyPath) -> None:
        self.lines[path] = COMMAND_LINE
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, sub in items:
            self._mark(sub, path + (key,))


def read_document(path: str | os.PathLike[str]) -> Document:
    """Parse `path` (module docstring). Raises `ConfigError` for an unreadable file, bad YAML, duplicate keys or
    unset environment variables."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding='utf-8')
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f'{file}: cannot read the file: {getattr(exc, "strerror", None) or exc}']) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f':{mark.line + 1}' if mark else ''
        raise ConfigError([f'{file}{line}: not valid YAML: {exc.problem or exc.context}']) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f'{file}: not valid YAML: {exc}']) from None
    doc = Document(file, None, {(): 1})
    errors: list[str] = []
    if node is not None:
        doc.values = _Reader(loader, doc, errors).read(node, ())
    loader.dispose()
    if errors:
        raise ConfigError(errors)
    return doc


@dataclass
class _Reader:
    loader: yaml.SafeLoader
    doc: Document
    errors: list[str]

    def read(self, node: yaml.Node, path: KeyPath) -> Any:
        if isinstance(node, yaml.MappingNode):
            self.loader.flatten_mapping(node)  # `<<: *anchor` merge keys
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    self.errors.append(f'{self.doc.file}:{key_node.start_mark.line + 1}: {key_text(path)}: '
                                       f'a key must be a plain name (expected name: value)')
                    continue
                key = str(key_node.value)
                sub = path + (key,)
                if key in out:
                    self.errors.append(f'{self.doc.file}:{key_node.start_mark.line + 1}: {key_text(sub)}: duplicate '
                                       f'key, first on line {self.doc.lines[sub]} (expected each key once per mapping)')
                    continue
                self.doc.lines[sub] = key_node.start_mark.line + 1
                out[key] = self.read(value_node, sub)
            return out
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                self.doc.lines[path + (i,)] = item.start_mark.line + 1
                items.append(self.read(item, path + (i,)))
            return items
        value = self.loader.construct_object(node)
        if isinstance(value, str) and '${' in value:
            value = self._expand(value, path, plain=node.style is None)
        return value

    def _expand(self, text: str, path: KeyPath, plain: bool) -> Any:
        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            value = os.environ.get(name)
            if default is not None and not value:
                return default
            if value is None:
                self.errors.append(self.doc.message(path, f'environment variable {name} is not set',
                                                    note=f'set it, or write ${{{name}:-default}}'))
                return ''
            return value
        expanded = _VAR.sub(substitute, text)
        if plain:  # an unquoted value keeps YAML's typing after expansion (numbers, booleans, null)
            try:
                retyped = yaml.safe_load(expanded)
            except yaml.YAMLError:
                return expanded
            if retyped is None or isinstance(retyped, (bool, int, float, str)):
                return retyped
        return expanded
