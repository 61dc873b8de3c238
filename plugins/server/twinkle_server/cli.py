"""`twinkle server ...` subcommands, added to the core CLI through the `twinkle_cli` hook.

twinkle server start --model Qwen/Qwen3-0.6B=/models/qwen3 --data-dir ./server-data --port 8000
twinkle server start --config server.yaml [--port 9000 ...]            # flags given override the file
twinkle server config check server.yaml                                 # every problem, with its line
twinkle server keys create --tenant alice --data-dir ./server-data      # prints tml-...
twinkle server keys create --tenant ops --admin --data-dir ./server-data   # an operator's key (console)
twinkle server keys revoke --tenant alice --data-dir ./server-data
twinkle server keys create --tenant alice --data-dir ./d --database-url postgresql://twinkle@db/twinkle
twinkle server keys create --tenant alice --config server.yaml         # the store the file's storage names
twinkle server export tinker://RUN/weights/NAME ./merged --merge --data-dir ./server-data   # for serving elsewhere
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from twinkle_core.cli.main import main as twinkle_main
from twinkle_core.errors import TwinkleError
from twinkle_core.hooks import hook
from twinkle_core.registry import resolve_class
from twinkle_server.config.flags import add_flags, checked, given
from twinkle_server.config.loading import ConfigError, describe, load_server_config, load_storage
from twinkle_server.config.options import keys_of
from twinkle_server.config.settings import ServerConfig
from twinkle_server.errors import ApiError
from twinkle_server.store import DatabaseError, Store
from twinkle_server.store.checkpoint_files import parse_path

_SERVER_KEYS = keys_of(ServerConfig, 'server') + keys_of(ServerConfig, 'storage')


@hook
def twinkle_cli(subparsers: argparse._SubParsersAction) -> None:
    server = subparsers.add_parser('server', help='run the multi-tenant training server; manage API keys')
    sub = server.add_subparsers(dest='server_command', metavar='SUBCOMMAND', required=True)

    start = sub.add_parser(
        'start',
        help='serve models over the Tinker-compatible and native APIs',
        description='Serve base models. Either flags alone (--model, --data-dir) or --config '
        'FILE (docs/deployment.md); with --config, each flag given overrides the '
        "file's value (the model flags apply to every model; --model replaces its "
        'models).',
    )
    start.add_argument(
        '--config',
        metavar='FILE',
        help='a server config file (YAML): models, device groups, deployment, limits, storage (docs/deployment.md)',
    )
    start.add_argument(
        '--model',
        action='append',
        metavar='NAME=PATH',
        help='a model to host: a local directory or ms:// / hf:// id, optionally under a public '
        'alias (NAME=PATH). Repeat for several base models. Required without --config.',
    )
    add_flags(start)  # one flag per declared config key that names one (config/settings.py, model_settings.py)
    start.add_argument(
        '--limits',
        metavar='FILE',
        help='JSON file of limits overriding the defaults key by key: '
        '{"default": {...}, "tenants": {name: {...}}} (docs/server.md)',
    )
    start.add_argument(
        '--pass-strategy',
        default=None,
        metavar='STRATEGY',
        help="shorthand for backend_args' pass_strategy, for a backend that declares pass strategies (e.g. "
        "MultiLoraTransformersModel): how adapters' queued forward/backward work shares passes: auto "
        '(measured, the default), mixed (one pass) or one_by_one',
    )
    start.set_defaults(func=_start)

    config = sub.add_parser('config', help='server config files')
    config_sub = config.add_subparsers(dest='config_command', metavar='ACTION', required=True)
    check = config_sub.add_parser('check', help='validate a config file: every problem with its line; exit 2 if any')
    check.add_argument('file', metavar='FILE')
    check.set_defaults(func=_check_config)

    keys = sub.add_parser('keys', help='API keys (tml-...) of tenants')
    keys_sub = keys.add_subparsers(dest='keys_command', metavar='ACTION', required=True)
    for action, helptext, fn in (
        ('create', 'issue a new key for a tenant (printed once)', _create_key),
        ('revoke', 'revoke every key of a tenant', _revoke_keys),
    ):
        p = keys_sub.add_parser(action, help=helptext)
        p.add_argument('--tenant', required=True)
        add_storage_flags(p)
        if action == 'create':
            p.add_argument(
                '--admin',
                action='store_true',
                help="an operator's key: it also opens the console's server-wide operator view (/console/operator)",
            )
        p.set_defaults(func=fn)

    add_export_parser(sub)


def _start(args: argparse.Namespace) -> int:
    from twinkle_server.launch import serve

    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(name)s: %(message)s')
    try:
        config = config_from_args(args)
        from twinkle_server.engine.deployment import check_backend_args

        check_backend_args(config)  # e.g. a pass_strategy the backend does not declare: one line, exit 2
        Store.open(config.database_url, config.data_dir).close()  # an unreachable database fails here, clearly
    except ConfigError as exc:
        print(f'twinkle server start: {count_errors(exc.errors)}:\n{exc}', file=sys.stderr)
        return 2
    except (ValueError, OSError, TwinkleError) as exc:
        print(f'twinkle server start: {exc}', file=sys.stderr)
        return 2
    serve(config, device=args.device)
    return 0


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The `ServerConfig` of parsed `twinkle server start` arguments: the --config file with every flag given laid
    over it, or the flags alone. Raises ValueError (a `ConfigError` for the file), OSError or TwinkleError."""
    return _config_from_file(args) if args.config else _config_from_flags(args)


def _config_from_flags(args: argparse.Namespace) -> ServerConfig:
    """Without --config: every model from --model, served with the same backend and sampler."""
    if not args.model or not args.data_dir:
        raise ValueError('--model and --data-dir are required (or give a config file with --config)')
    server, storage, model = (checked(args, section) for section in ('server', 'storage', 'models'))
    model.pop('device', None)  # --device places every embedded model host (`serve(device=...)`)
    model = _with_pass_strategy(model, args)
    # an unknown or uninstalled backend or sampler fails here, not after loading
    resolve_class('model', model.get('backend', ServerConfig.backend))
    resolve_class('sampler', model.get('sampler', ServerConfig.sampler))
    default, per_tenant = ServerConfig.load_limits(args.limits)
    values = {**server, **storage}  # the two sections' keys are distinct
    fields = {key.field: key.to_field(values[key.name]) for key in _SERVER_KEYS if key.name in values}
    return ServerConfig(
        models=dict(ServerConfig.parse_model(m) for m in args.model),
        default_limits=default,
        tenant_limits=per_tenant,
        **fields,
        **model,
    )


def _config_from_file(args: argparse.Namespace) -> ServerConfig:
    """--config FILE with every flag given laid over it (`config.load_server_config` overrides)."""
    overrides: dict[str, Any] = {
        section: values for section in ('server', 'storage') if (values := given(args, section))
    }
    model = _with_pass_strategy(given(args, 'models'), args)
    if args.limits is not None:
        ServerConfig.load_limits(args.limits)  # its own messages for a bad file
        overrides['limits'] = json.loads(Path(args.limits).read_text())
    if args.model:  # --model replaces the file's models
        overrides['models'] = [
            {'name': name, 'path': path, **model} for name, path in (ServerConfig.parse_model(m) for m in args.model)
        ]
    elif model:  # the other model flags apply to every model of the file
        overrides['models'] = model
    return load_server_config(args.config, overrides)


def _with_pass_strategy(model: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """`--pass-strategy S` is sugar for ``backend_args['pass_strategy'] = S``: one path into the backend, checked
    against its declared `pass_strategies` when its host is built (`model_host.construction.build_backend`)."""
    if args.pass_strategy is None:
        return model
    return {**model, 'backend_args': {**model.get('backend_args', {}), 'pass_strategy': args.pass_strategy}}


def _check_config(args: argparse.Namespace) -> int:
    try:
        config = load_server_config(args.file)
    except ConfigError as exc:
        print(f'{args.file}: {count_errors(exc.errors)}:\n{exc}', file=sys.stderr)
        return 2
    print(f'{args.file}: OK ({describe(config)})')
    return 0


def _create_key(args: argparse.Namespace) -> int:
    from twinkle_server.service.auth import create_api_key

    store = open_store(args, 'keys create')
    if store is None:
        return 2
    try:
        print(create_api_key(store, args.tenant, admin=args.admin))
    except ValueError as exc:
        print(f'twinkle server keys create: {exc}', file=sys.stderr)
        return 2
    finally:
        store.close()
    return 0


def _revoke_keys(args: argparse.Namespace) -> int:
    store = open_store(args, 'keys revoke')
    if store is None:
        return 2
    try:
        n = store.revoke_api_keys(args.tenant)
    finally:
        store.close()
    print(f'revoked {n} key(s) of tenant {args.tenant!r}')
    return 0


def add_storage_flags(parser: argparse.ArgumentParser) -> None:
    """--config FILE (the server's; its storage section names the store) and the storage flags over it."""
    parser.add_argument(
        '--config',
        metavar='FILE',
        help="the server's config file: its storage section names the "
        'store (--data-dir / --database-url given override it)',
    )
    add_flags(parser, sections=('storage',))  # --data-dir (required without --config), --database-url


def open_store(args: argparse.Namespace, command: str) -> Any:
    """The server's metadata store (`--database-url`, else SQLite in `--data-dir`; with `--config`, the file's
    storage section under the flags given); None after printing why it cannot be opened."""
    data_dir, database_url = args.data_dir, args.database_url
    try:
        if args.config:
            given = {'data_dir': data_dir, 'database_url': database_url}
            data_dir, database_url = load_storage(args.config, {k: v for k, v in given.items() if v is not None})
        elif not data_dir:
            raise ValueError("--data-dir is required (or give the server's config file with --config)")
        return Store.open(database_url, data_dir)
    except ConfigError as exc:
        print(f'twinkle server {command}: {count_errors(exc.errors)}:\n{exc}', file=sys.stderr)
    except (DatabaseError, ValueError) as exc:
        print(f'twinkle server {command}: {exc}', file=sys.stderr)
    return None


def count_errors(errors: list[str]) -> str:
    return f'{len(errors)} error{"s" if len(errors) != 1 else ""}'


# ---- twinkle server export ---------------------------------------------------------------------------------
def add_export_parser(sub: argparse._SubParsersAction) -> None:
    """`twinkle server export`: a checkpoint the service stored, as a plain directory for serving elsewhere -- the
    operator's way out of the store (any tenant's checkpoint). The store names its directory; the export is the
    core CLI's `twinkle export` (contributed by the Transformers backend) on it: the PEFT adapter (or full model)
    files, or with --merge one Hugging Face model with the LoRA folded into the base it names."""
    export = sub.add_parser(
        'export',
        help='a stored checkpoint (tinker://...) as a plain HF / PEFT directory; --merge folds the LoRA into its base',
    )
    export.add_argument('path', metavar='tinker://RUN/weights/NAME', help='the checkpoint, as the SDK names it')
    export.add_argument('output_dir', help='where to write (replaced atomically if it exists)')
    export.add_argument('--merge', action='store_true', help='merge the LoRA into its base model')
    export.add_argument('--base', help='the base model directory (default: the one the adapter names)')
    export.add_argument('--dtype', default='float32', help='dtype of the merged weights (float32, bfloat16, float16)')
    add_storage_flags(export)
    export.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    try:
        path = parse_path(args.path)
    except ApiError as exc:
        print(f'twinkle server export: {exc.message}', file=sys.stderr)
        return 2
    store = open_store(args, 'export')
    if store is None:
        return 2
    try:
        row = store.checkpoint_of_any_tenant(path.run_id, path.checkpoint_id)
    finally:
        store.close()
    if row is None:
        print(f'twinkle server export: no checkpoint {args.path} in this store (or it has expired)', file=sys.stderr)
        return 1
    argv = ['export', row.directory, args.output_dir, '--dtype', args.dtype]
    argv += ['--merge'] if args.merge else []
    argv += ['--base', args.base] if args.base else []
    return twinkle_main(argv)
