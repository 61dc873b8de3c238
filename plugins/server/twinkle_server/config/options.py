"""Every key of the server's config file declared once, on the settings field it sets.

A settings dataclass declares a key with `option(default, rule=..., meaning=..., flag=...)`: the field's default is
the key's default, `rule` says what a value must be (the loader's error messages come from it), `meaning` is the
docs' description and the flag's help, and `flag` (optional) is the `twinkle server start` flag that sets it, with
or without a config file. From that one declaration come: the loader's tables of known keys (`schema`), the
command-line flags and how they override a file (`cli`), the range checks of flag values, and the key tables of
docs/deployment.md (`markdown_table`, held equal by a test).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import MISSING, dataclass
from typing import Any, Callable, NamedTuple

from twinkle_server.config.rules import Rule

OPTION = 'twinkle_option'  # the metadata key of a declared field


@dataclass(frozen=True)
class Option:
    """How a settings field appears in the config file and on the command line (module docstring)."""

    rule: Rule
    meaning: str
    section: str = ''  # the file section, when the class spans several (ServerConfig: server, storage)
    key: str | None = None  # the file key, when it differs from the field's name
    flag: str | None = None  # `twinkle server start` flag, e.g. '--port'
    metavar: str | None = None
    scale: int = 1  # field value = file value x scale (a size in MiB -> bytes)
    default_text: str | None = None  # the docs' default, where the field's default does not say it


def option(default: Any = MISSING, *, factory: Callable[[], Any] | None = None, **declared: Any) -> Any:
    """A dataclass field declaring one config key: its default (or `factory`; neither: required) and the keyword
    arguments of `Option`."""
    metadata = {OPTION: Option(**declared)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


class Key(NamedTuple):
    """One declared key: the settings `field` it sets, its file `name`, its `option`, the field's default."""

    field: str
    name: str
    option: Option
    default: Any

    @property
    def required(self) -> bool:
        return self.default is MISSING

    def to_field(self, value: Any) -> Any:
        """A value as the file gives it -> the field's value (a size in MiB -> bytes, a list -> a tuple field)."""
        if isinstance(value, list) and isinstance(self.default, tuple):
            return tuple(value)
        if value is None or self.option.scale == 1:
            return value
        return int(value * self.option.scale)

    def default_text(self) -> str:
        """The docs' default column: `required`, the declared text, or the default as the file spells it."""
        if self.option.default_text is not None:
            return self.option.default_text
        if self.required:
            return 'required'
        value = self.default
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = value / self.option.scale if self.option.scale != 1 else value
        return f'`{file_spelling(value)}`'

    def from_flag(self, value: Any) -> Any:
        """A flag's parsed value -> the value as the file gives it (a JSON object for a mapping)."""
        if dict in self.option.rule.types and isinstance(value, str):
            return parse_json_object(value, self.option.flag or self.name)
        return value


def keys_of(cls: type, section: str = '') -> list[Key]:
    """The declared keys of settings class `cls` (of its `section`, for a class that spans several), in order."""
    out = []
    for f in dataclasses.fields(cls):
        declared: Option | None = f.metadata.get(OPTION)
        if declared is None or declared.section != section:
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        out.append(Key(f.name, declared.key or f.name, declared, default))
    return out


def rules_of(cls: type, section: str = '') -> dict[str, Any]:
    """File key -> `Rule`, for every declared key of `cls` (its `section`)."""
    return {key.name: key.option.rule for key in keys_of(cls, section)}


def markdown_table(cls: type, section: str = '', prefix: str = '', labels: dict[str, str] | None = None) -> str:
    """The docs' `| key | default | meaning |` table of `cls`'s declared keys (its `section`), each named
    `prefix` + key (or by `labels`)."""
    rows = ['| key | default | meaning |', '| --- | --- | --- |'] + markdown_rows(cls, section, prefix, labels)
    return '\n'.join(rows)


def markdown_rows(cls: type, section: str = '', prefix: str = '', labels: dict[str, str] | None = None) -> list[str]:
    """The rows of `markdown_table`."""
    labels = labels or {}
    return [
        f'| {labels.get(k.name, f"`{prefix}{k.name}`")} | {k.default_text()} | {k.option.meaning} |'
        for k in keys_of(cls, section)
    ]


def file_spelling(value: Any) -> str:
    """A default as YAML spells it: null, true, 30, 0.25, [], {}, text."""
    if value is None or isinstance(value, bool):
        return {None: 'null', True: 'true', False: 'false'}[value]
    if isinstance(value, float):
        return f'{value:g}'
    if isinstance(value, (tuple, list)):
        return '[' + ', '.join(file_spelling(v) for v in value) + ']'
    if isinstance(value, dict):
        return '{' + ', '.join(f'{k}: {file_spelling(v)}' for k, v in value.items()) + '}'
    return str(value)


def parse_json_object(text: str, option: str) -> dict[str, Any]:
    """A flag's JSON object (`--sampler-args '{...}'`); ValueError naming the flag otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f'{option}: not valid JSON: {exc}') from None
    if not isinstance(value, dict):
        raise ValueError(f'{option}: expected a JSON object, got {type(value).__name__}')
    return value
