"""`twinkle console --logdir DIR [--host H] [--port P]`: serve the local console until interrupted."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ['add_parser']


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        'console', help='browse the metrics of local runs (JSONL under --logdir) in a web browser'
    )
    p.add_argument('--logdir', default='output', help='directory searched for metrics JSONL files (default: output)')
    p.add_argument('--host', default='127.0.0.1', help='address to listen on (default: 127.0.0.1, this machine only)')
    p.add_argument('--port', type=int, default=6007, help='port to listen on (default: 6007; 0 picks a free one)')
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from twinkle_core.console.local import BASE, make_server

    logdir = Path(args.logdir)
    if not logdir.is_dir():
        print(f'twinkle console: {logdir} is not a directory; pass the directory your runs write to', file=sys.stderr)
        return 2
    try:
        server = make_server(logdir, args.host, args.port)
    except OSError as exc:
        print(f'twinkle console: cannot listen on {args.host}:{args.port}: {exc}; try --port 0', file=sys.stderr)
        return 2
    host, port = str(server.server_address[0]), int(server.server_address[1])
    print(f'twinkle console: runs under {logdir.resolve()} at http://{host}:{port}{BASE}  (Ctrl-C stops)', flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
