"""`twinkle server ...` subcommands, added to the core CLI through the `twinkle_cli` hook.

    twinkle server start --model Qwen/Qwen3-0.6B=/models/qwen3 --data-dir ./server-data --port 8000
    twinkle server keys create --tenant alice --data-dir ./server-data      # prints tml-...
    twinkle server keys revoke --tenant alice --data-dir ./server-data
"""
from __future__ import annotations

import argparse
import logging
import sys

from twinkle_core.hooks import hook


@hook
def twinkle_cli(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    server = subparsers.add_parser('server', help='run the multi-tenant training server; manage API keys')
    sub = server.add_subparsers(dest='server_command', metavar='SUBCOMMAND', required=True)

    start = sub.add_parser('start', help='serve models over the Tinker-compatible and native APIs')
    start.add_argument('--model', action='append', required=True, metavar='NAME=PATH',
                       help='a model to host: a local directory or ms:// / hf:// id, optionally under a public '
                            'alias (NAME=PATH). Repeat for several base models.')
    start.add_argument('--host', default='127.0.0.1')
    start.add_argument('--port', type=int, default=8000)
    start.add_argument('--data-dir', required=True, help='SQLite metadata and checkpoints live here')
    start.add_argument('--device', default=None, help='cpu, cuda, cuda:1, ... (default: CUDA when available)')
    start.add_argument('--max-body-mb', type=float, default=64.0, help='largest accepted request body')
    start.add_argument('--max-queued-samples', type=int, default=256, help='per model; more answers 429')
    start.add_argument('--limits', help='JSON file of limits overriding the defaults key by key: '
                                        '{"default": {...}, "tenants": {name: {...}}} (docs/server.md)')
    start.add_argument('--seq-gap-timeout', type=float, default=120.0, metavar='SECONDS',
                       help="how long a model's request may wait for a missing earlier seq_id before it is failed")
    start.add_argument('--max-failed-logins', type=int, default=30, metavar='N',
                       help='failed logins per minute from one address before it is answered 429')
    start.add_argument('--backend', default='MultiLoraTransformersModel', metavar='NAME',
                       help='the training backend, by registry name (kind model): MultiLoraTransformersModel '
                            '(default: many adapters, mixed passes) or any installed model backend')
    start.add_argument('--backend-args', default='{}', metavar='JSON',
                       help='JSON object of backend constructor arguments, e.g. \'{"max_length": 4096}\'')
    start.add_argument('--pass-strategy', default=None, metavar='STRATEGY',
                       help="multi-LoRA backends: how adapters' queued forward/backward work shares passes: auto "
                            '(measured, the default), mixed (one pass) or one_by_one')
    start.add_argument('--sampler', default='TorchSampler', metavar='NAME',
                       help='the sampler serving generation, by registry name: TorchSampler (default) or '
                            'vLLMSampler (pip install twinkle-vllm)')
    start.add_argument('--sampler-args', default='{}', metavar='JSON',
                       help='JSON object of sampler constructor arguments, e.g. '
                            '\'{"engine_args": {"max_model_len": 4096}}\'')
    start.add_argument('--allow-path', action='append', default=[], metavar='DIR',
                       help='a directory native calls may name files in (besides each model\'s own); repeatable')
    start.set_defaults(func=_start)

    keys = sub.add_parser('keys', help='API keys (tml-...) of tenants')
    keys_sub = keys.add_subparsers(dest='keys_command', metavar='ACTION', required=True)
    for action, helptext, fn in (('create', 'issue a new key for a tenant (printed once)', _create_key),
                                 ('revoke', 'revoke every key of a tenant', _revoke_keys)):
        p = keys_sub.add_parser(action, help=helptext)
        p.add_argument('--tenant', required=True)
        p.add_argument('--data-dir', required=True)
        p.set_defaults(func=fn)


def _start(args: argparse.Namespace) -> int:
    from twinkle_core.errors import TwinkleError
    from twinkle_core.registry import resolve_class
    from twinkle_server.config import ServerConfig
    from twinkle_server.launch import serve
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(name)s: %(message)s')
    try:
        models = dict(ServerConfig.parse_model(m) for m in args.model)
        default, per_tenant = ServerConfig.load_limits(args.limits)
        sampler_args = ServerConfig.parse_json_object(args.sampler_args, '--sampler-args')
        backend_args = ServerConfig.parse_json_object(args.backend_args, '--backend-args')
        if args.pass_strategy is not None:
            backend_args['pass_strategy'] = args.pass_strategy
        # an unknown or uninstalled backend or sampler fails here, not after loading
        resolve_class('model', args.backend)
        resolve_class('sampler', args.sampler)
    except (ValueError, OSError, TwinkleError) as exc:
        print(f'twinkle server start: {exc}', file=sys.stderr)
        return 2
    config = ServerConfig(models=models, data_dir=args.data_dir, host=args.host, port=args.port,
                          max_body_bytes=int(args.max_body_mb * 1024 * 1024),
                          max_queued_samples=args.max_queued_samples, default_limits=default,
                          tenant_limits=per_tenant, seq_gap_timeout_s=args.seq_gap_timeout,
                          max_failed_logins_per_minute=args.max_failed_logins, allowed_roots=tuple(args.allow_path),
                          backend=args.backend, backend_args=backend_args, sampler=args.sampler,
                          sampler_args=sampler_args)
    serve(config, device=args.device)
    return 0


def _create_key(args: argparse.Namespace) -> int:
    from twinkle_server.auth import create_api_key
    from twinkle_server.store import Store
    store = Store(args.data_dir)
    try:
        print(create_api_key(store, args.tenant))
    except ValueError as exc:
        print(f'twinkle server keys create: {exc}', file=sys.stderr)
        return 2
    finally:
        store.close()
    return 0


def _revoke_keys(args: argparse.Namespace) -> int:
    from twinkle_server.store import Store
    store = Store(args.data_dir)
    try:
        n = store.revoke_api_keys(args.tenant)
    finally:
        store.close()
    print(f'revoked {n} key(s) of tenant {args.tenant!r}')
    return 0
