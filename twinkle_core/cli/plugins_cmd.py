"""`twinkle plugins list [--kind K]` and `twinkle plugins info NAME [--kind K]`.

`list` reads entry-point metadata and the registry/ index only: no plugin module (and no torch) is imported.
`info` loads the one component asked for and shows its provider, signature and docstring.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from typing import Any

HOOKS_KIND = 'hooks'  # pseudo-kind for `twinkle.hooks` entry points (lifecycle hook plugins)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser('plugins', help='list and inspect components and plugins')
    sub = parser.add_subparsers(dest='plugins_command', metavar='{list,info}', required=True)
    lister = sub.add_parser('list', help='every component name, its kind and the distribution providing it')
    lister.add_argument('--kind', help=f'only this kind (or "{HOOKS_KIND}" for hook plugins)')
    lister.add_argument('--json', action='store_true', help='one JSON object per line instead of a table')
    lister.set_defaults(func=list_command)
    info = sub.add_parser('info', help='load one component and show its provider, signature and doc')
    info.add_argument('name')
    info.add_argument('--kind', help='the kind, when the name exists under several kinds (required for hub refs)')
    info.set_defaults(func=info_command)


def rows(kind: str | None = None) -> list[dict[str, str]]:
    """Rows of `twinkle plugins list`: name, kind, provider, source, target."""
    from twinkle_core import plugins
    from twinkle_core.registry import list_components

    out = []
    if kind != HOOKS_KIND:
        out += [
            {'name': c.name, 'kind': c.kind, 'provider': c.provider, 'source': c.source, 'target': c.target}
            for c in list_components(kind)
        ]
    if kind in (None, HOOKS_KIND):
        out += [
            {
                'name': ep.name,
                'kind': HOOKS_KIND,
                'provider': plugins.distribution_of(ep),
                'source': 'entry_point',
                'target': ep.value,
            }
            for ep in plugins.entry_points_of_group('twinkle.hooks')
        ]
    return out


def list_command(args: argparse.Namespace) -> int:
    table = rows(args.kind)
    if args.json:
        for row in table:
            print(json.dumps(row))
        return 0
    if not table:
        print(f'No components{f" of kind {args.kind!r}" if args.kind else ""} found.')
        return 0
    print(format_table(table, ['name', 'kind', 'provider', 'source', 'target']))
    return 0


def format_table(table: list[dict[str, str]], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(r[c]) for r in table)) for c in columns}
    lines = ['  '.join(c.upper().ljust(widths[c]) for c in columns).rstrip()]
    lines += ['  '.join(r[c].ljust(widths[c]) for c in columns).rstrip() for r in table]
    return '\n'.join(lines)


def info_command(args: argparse.Namespace) -> int:
    from twinkle_core.errors import TwinkleError
    from twinkle_core.hub.ref import is_hub_ref
    from twinkle_core.registry import resolve_class

    if is_hub_ref(args.name):
        if not args.kind:
            raise TwinkleError('Pass --kind with a hub reference, e.g. --kind patch.')
        matches = [{'name': args.name, 'kind': args.kind, 'provider': args.name, 'source': 'hub', 'target': ''}]
    else:
        matches = [r for r in rows(args.kind) if r['name'] == args.name and r['kind'] != HOOKS_KIND]
    if not matches:
        if args.kind:  # let the resolver explain (close matches, providers, pip install line)
            resolve_class(args.kind, args.name)
        raise TwinkleError(f'No component named {args.name!r}. See `twinkle plugins list`.')
    if len(matches) > 1:
        kinds = ', '.join(m['kind'] for m in matches)
        raise TwinkleError(f'{args.name!r} exists under several kinds ({kinds}); pass --kind.')
    row = matches[0]
    obj = resolve_class(row['kind'], args.name)
    print(describe(obj, row))
    return 0


def describe(obj: Any, row: dict[str, str]) -> str:
    lines = [f'{key}: {row[key]}' for key in ('name', 'kind', 'provider', 'source', 'target') if row.get(key)]
    lines.append(f'object: {getattr(obj, "__module__", "?")}.{getattr(obj, "__qualname__", repr(obj))}')
    module = sys.modules.get(getattr(obj, '__module__', ''), None)
    if module is not None and getattr(module, '__file__', None):
        lines.append(f'file: {module.__file__}')
    try:
        lines.append(f'signature: {getattr(obj, "__name__", "")}{inspect.signature(obj)}')
    except (TypeError, ValueError):
        pass
    doc = inspect.getdoc(obj)
    if doc:
        lines += ['', doc]
    return '\n'.join(lines)
