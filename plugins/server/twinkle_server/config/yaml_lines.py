"""Reading a config file with positions: YAML (JSON is YAML too) -> plain values plus the line of every key.

- `read_document(path)` -> `Document`: the values (dicts, lists, scalars) and `lines`, which maps each key path
  (e.g. ``('models', 0, 'path')``) to the line it is written on. Duplicate keys are errors, not silently merged.
- String values may use environment variables: ``${VAR}`` (an error when unset) and ``${VAR:-default}`` (the default
  when VAR is unset or empty; it may itself hold references, ``${A:-${B:-x}}``, read only when used, and cannot
  hold ``}``). ``$${`` is a literal ``${``; any other ``${`` is an error. An unquoted value is read again after
  expansion, so ``port: ${PORT:-8000}`` is a number; quote it (``"${PORT:-8000}"``) to keep a string.
- Anchors, aliases and ``<<: *anchor`` merge keys work (a mapping's own keys override merged ones); an alias inside
  the value it names, and a file that expands to more than MAX_VALUES values or MAX_DEPTH levels, are errors.
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
_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
_FORMS = '${NAME} or ${NAME:-default}; $${ for a literal ${'
_MERGE = 'tag:yaml.org,2002:merge'
MAX_VALUES = 100_000  # values a file may expand to (aliases repeat values: an alias bomb stops here)
MAX_DEPTH = 64  # nesting levels of mappings and lists
_TOO_DEEP = f'nested more than {MAX_DEPTH} levels deep'


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
                out[key] = (
                    self._merge(value.get(key), sub, path + (key,))
                    if key in value
                    else self._replace(sub, path + (key,))
                )
            return out
        if path == ('models',) and isinstance(override, dict) and isinstance(value, list):
            return [self._merge(item, override, path + (i,)) for i, item in enumerate(value)]
        return self._replace(override, path)

    def _replace(self, override: Any, path: KeyPath) -> Any:
        for p in [p for p in self.lines if p[: len(path)] == path]:
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
    except RecursionError:
        raise ConfigError(
            [
                f'{file}:{loader.get_mark().line + 1}: not valid YAML: {_TOO_DEEP} (expected at most '
                f'{MAX_DEPTH} levels of mappings and lists)'
            ]
        ) from None
    doc = Document(file, None, {(): 1})
    errors: list[str] = []
    if node is not None:
        try:
            doc.values = _Reader(loader, doc, errors).read(node, ())
        except _TooBig as exc:
            errors.append(str(exc))
    loader.dispose()
    if errors:
        raise ConfigError(errors)
    return doc


class _TooBig(Exception):
    """The file expands past MAX_VALUES or MAX_DEPTH (the message is the finished error line)."""


class _Unterminated(Exception):
    """A ``${`` without its ``}``."""


@dataclass
class _Reader:
    loader: yaml.SafeLoader
    doc: Document
    errors: list[str]
    values: int = 0
    open: set[int] = field(default_factory=set)  # ids of the nodes being read: an alias to one of them is a cycle
    merged: dict[int, dict[str, tuple[yaml.Node, yaml.Node]]] = field(default_factory=dict)  # pairs() by node
    merging: set[int] = field(default_factory=set)  # ids of the mappings whose pairs are being collected

    def read(self, node: yaml.Node, path: KeyPath) -> Any:
        self.values += 1
        if len(path) > MAX_DEPTH:
            raise _TooBig(self.doc.message(path[:1], _TOO_DEEP, f'at most {MAX_DEPTH} levels of mappings and lists'))
        if self.values > MAX_VALUES:
            raise _TooBig(
                self.doc.message(
                    path[:1],
                    f'the file expands to more than {MAX_VALUES} values',
                    note='each alias repeats the value it names: is one repeated many times?',
                )
            )
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, path)
        if id(node) in self.open:
            self.errors.append(
                self.doc.message(
                    path, 'an alias refers to a value that contains it', 'an alias outside the anchored value'
                )
            )
            return None
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path)
            items = []
            for i, item in enumerate(node.value):
                self.doc.lines[path + (i,)] = item.start_mark.line + 1
                items.append(self.read(item, path + (i,)))
            return items
        finally:
            self.open.discard(id(node))

    def mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, (key_node, value_node) in self.pairs(node, path).items():
            self.doc.lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = self.read(value_node, path + (key,))
        return out

    def pairs(self, node: yaml.MappingNode, path: KeyPath) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """Key -> (key node, value node) of `node`: its own keys over its `<<` merges (the first listed wins)."""
        if id(node) in self.merged:
            return self.merged[id(node)]
        self.merging.add(id(node))
        merged: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        own: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE:
                for key, pair in self.merge(value_node, path, line).items():
                    if key not in own:
                        merged.setdefault(key, pair)
            elif not isinstance(key_node, yaml.ScalarNode):
                self.errors.append(
                    f'{self.doc.file}:{line}: {key_text(path)}: a key must be a plain name (expected name: value)'
                )
            elif str(key_node.value) in own:
                key = str(key_node.value)
                self.errors.append(
                    f'{self.doc.file}:{line}: {key_text(path + (key,))}: duplicate key, first on '
                    f'line {own[key]} (expected each key once per mapping)'
                )
            else:
                own[str(key_node.value)] = line
                merged[str(key_node.value)] = (key_node, value_node)
        self.merging.discard(id(node))
        self.merged[id(node)] = merged
        return merged

    def merge(self, value: yaml.Node, path: KeyPath, line: int) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """The pairs a ``<<: *a`` / ``<<: [*a, *b]`` brings in (earlier mappings win)."""
        sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for source in reversed(sources):
            if not isinstance(source, yaml.MappingNode):
                self.errors.append(
                    f'{self.doc.file}:{line}: {key_text(path)}: a merge key (<<) takes a mapping '
                    f'(expected <<: *anchor or <<: [*a, *b])'
                )
            elif id(source) in self.merging:
                self.errors.append(
                    f'{self.doc.file}:{line}: {key_text(path)}: a merge key (<<) refers to a '
                    f'mapping that contains it (expected a merge of another mapping)'
                )
            else:
                out.update(self.pairs(source, path))
        return out

    def scalar(self, node: yaml.ScalarNode, path: KeyPath) -> Any:
        value = self.loader.construct_object(node)
        if isinstance(value, str) and '${' in value:
            value = self._expand(value, path, plain=node.style is None)
        return value

    def _expand(self, text: str, path: KeyPath, plain: bool) -> Any:
        try:
            expanded, _ = self._scan(text, 0, path, nested=False, used=True)
        except _Unterminated:
            self.errors.append(self.doc.message(path, f'unterminated ${{ in {text!r}', _FORMS))
            return text
        if plain:  # an unquoted value keeps YAML's typing after expansion (numbers, booleans, null)
            try:
                retyped = yaml.safe_load(expanded)
            except yaml.YAMLError:
                return expanded
            if retyped is None or isinstance(retyped, (bool, int, float, str)):
                return retyped
        return expanded

    def _scan(self, text: str, i: int, path: KeyPath, *, nested: bool, used: bool) -> tuple[str, int]:
        """`text` from `i` with its references expanded, up to its end (or, `nested`, the ``}`` closing a default):
        (the expansion, where it stopped). Unset variables are reported only when `used`."""
        out: list[str] = []
        while i < len(text):
            if text.startswith('$${', i):
                out.append('${')
                i += 3
            elif text.startswith('${', i):
                value, i = self._reference(text, i, path, used)
                out.append(value)
            elif nested and text[i] == '}':
                return ''.join(out), i
            else:
                out.append(text[i])
                i += 1
        if nested:
            raise _Unterminated
        return ''.join(out), i

    def _reference(self, text: str, i: int, path: KeyPath, used: bool) -> tuple[str, int]:
        """The value of the ``${...}`` at `i` and the index after it."""
        match = _NAME.match(text, i + 2)
        end = match.end() if match else i + 2
        if match and text.startswith('}', end):
            return self._variable(match.group(), path, used), end + 1
        if match and text.startswith(':-', end):
            value = os.environ.get(match.group())
            default, close = self._scan(text, end + 2, path, nested=True, used=used and not value)
            return (value if value else default), close + 1
        if end >= len(text) or '}' not in text[end:]:
            raise _Unterminated
        form = text[i : text.index('}', end) + 1]
        self.errors.append(self.doc.message(path, f'unsupported reference {form} in {text!r}', _FORMS))
        return form, i + len(form)

    def _variable(self, name: str, path: KeyPath, used: bool) -> str:
        value = os.environ.get(name)
        if value is None and used:
            self.errors.append(
                self.doc.message(
                    path, f'environment variable {name} is not set', note=f'set it, or write ${{{name}:-default}}'
                )
            )
        return value or ''
