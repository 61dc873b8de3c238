"""The `twinkle server start` flags of declared config keys (`options`): a key declared with a `flag` is that
flag, with its help from the key's meaning and default. Given alone, the flags build a `ServerConfig` (each value
checked against the key's rule); given with `--config FILE`, they are laid over the file's values (`overrides`)."""

from __future__ import annotations

import argparse
from typing import Any

from twinkle_server.config.model_settings import ModelSpec
from twinkle_server.config.options import Key, keys_of
from twinkle_server.config.settings import ServerConfig

#: file section -> the keys of it that may carry a flag (a model flag applies to every model)
SECTIONS: dict[str, list[Key]] = {
    'server': keys_of(ServerConfig, 'server'),
    'storage': keys_of(ServerConfig, 'storage'),
    'models': keys_of(ModelSpec),
}


def flag_keys(sections: tuple[str, ...] = tuple(SECTIONS)) -> list[tuple[str, Key]]:
    """(file section, key) of every key of `sections` that has a flag, in declaration order."""
    return [(section, key) for section in sections for key in SECTIONS[section] if key.option.flag]


def add_flags(parser: argparse.ArgumentParser, sections: tuple[str, ...] = tuple(SECTIONS)) -> None:
    """One flag per declared key of `sections` that names one; none has an argparse default (None: not given)."""
    for section, key in flag_keys(sections):
        types = key.option.rule.types
        kwargs: dict[str, Any] = {'metavar': key.option.metavar, 'dest': _dest(key), 'help': _help(section, key)}
        if list in types:
            kwargs['action'] = 'append'
        elif types == (int,):
            kwargs['type'] = int
        elif float in types:
            kwargs['type'] = float
        assert key.option.flag is not None
        parser.add_argument(key.option.flag, **kwargs)


def given(args: argparse.Namespace, section: str) -> dict[str, Any]:
    """File key -> value, as the file spells it, of every flag of `section` that was given."""
    out = {}
    for _, key in flag_keys((section,)):
        value = getattr(args, _dest(key), None)
        if value is not None:
            out[key.name] = key.from_flag(value)
    return out


def checked(args: argparse.Namespace, section: str) -> dict[str, Any]:
    """`given`, each value checked against its key's rule; ValueError naming the flag, the problem and what is
    expected (without a config file: with one, the loader checks them and names the key)."""
    values = given(args, section)
    for key in SECTIONS[section]:
        if key.name in values and key.option.rule.types != (list,):
            problem = key.option.rule.problem_with(values[key.name])
            if problem:
                raise ValueError(f'{key.option.flag}: {problem} ({key.option.rule.expected})')
    return values


def markdown_rows() -> list[str]:
    """The docs' `| flag | overrides |` rows of the declared flags."""
    rows = []
    for section, key in flag_keys():
        target = f"every model's `{key.name}`" if section == 'models' else f'`{section}.{key.name}`'
        if dict in key.option.rule.types:
            target += ', merged key by key'
        elif list in key.option.rule.types:
            target += ' (repeatable: the flags given replace the list)'
        rows.append(f'| `{key.option.flag}` | {target} |')
    return rows


def _dest(key: Key) -> str:
    return (key.option.flag or key.name).lstrip('-').replace('-', '_')


def _help(section: str, key: Key) -> str:
    sets = f"every model's {key.name}" if section == 'models' else f'{section}.{key.name}'
    text = f'{key.option.meaning} (default {key.default_text()}; sets {sets} of a config file'
    text += '; repeatable)' if list in key.option.rule.types else ')'
    return text.replace('`', '').replace('%', '%%')
