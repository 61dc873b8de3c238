"""Run a worker script in one process or under torchrun (gloo on CPU) and read back its ``result.json``.

Workers: `distributed/train_worker.py` (the default: DDP / FSDP2 / TP of TransformersModel) and
`megatron/megatron_worker.py`. Every worker takes ``--model DIR --out DIR`` and writes ``OUT/result.json``.

`run_worker` runs them through this process's `WorkerPool` (`shared_pool`): fork servers (fork_server.py) whose ranks
import everything once per test process and fork a fresh child per run, instead of paying the imports (~3-5 s of CPU
per rank) in new processes every time; `start_worker` starts new processes (``python worker.py`` / ``torchrun``).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from twinkle_core.utils.net import free_port

TESTS = Path(__file__).parent
WORKER = TESTS / 'distributed' / 'train_worker.py'


def torchrun_command(nproc: int) -> list[str]:
    """``torchrun --standalone`` on `nproc` local ranks: its rendezvous binds a port of its own choosing (port 0), so
    concurrent launches never race for one picked in advance (``free_port()`` + ``--master_port`` could find it taken
    by the time torchrun bound it: EADDRINUSE)."""
    return [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', str(nproc)]


def run_worker(
    model_dir: Path, out: Path, *, nproc: int = 1, extra: tuple[str, ...] = (), worker: Path = WORKER
) -> dict:
    """Run `worker` on `nproc` ranks (forked from this process's fork servers); return its result.json."""
    return shared_pool().run_worker(model_dir, out, nproc=nproc, extra=extra, worker=worker)


_POOL: WorkerPool | None = None


def shared_pool() -> WorkerPool:
    """This process's `WorkerPool` (one per pytest-xdist worker), closed when the process exits."""
    global _POOL
    if _POOL is None:
        _POOL = WorkerPool(Path(tempfile.mkdtemp(prefix='twinkle-fork-servers-')))
        atexit.register(_POOL.close)
    return _POOL


def start_worker(
    model_dir: Path, out: Path, *, nproc: int = 1, extra: tuple[str, ...] = (), worker: Path = WORKER
) -> dict:
    """Run `worker` in a new process, or under torchrun with `nproc` ranks; return its result.json."""
    args = ['--model', str(model_dir), '--out', str(out), *extra]
    if nproc == 1:
        cmd = [sys.executable, str(worker), *args]
    else:
        cmd = [*torchrun_command(nproc), str(worker), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    assert proc.returncode == 0, f'{" ".join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}'
    return json.loads((Path(out) / 'result.json').read_text())


class WorkerPool:
    """`start_worker` with one `fork_server.ForkServer` per (worker, nproc), started on first use and kept until
    `close`. Same arguments, result and failure (an AssertionError with the ranks' output) as `start_worker`; it
    falls back to `start_worker` where forking is unsafe or unavailable: CUDA visible (the servers must never initialise
    it), not Linux, ``TWINKLE_TESTS_FORK_SERVER=0``, or servers that do not start cleanly (with a warning)."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = Path(logdir)
        self.servers: dict[tuple[str, int], object] = {}
        self.enabled = (
            os.environ.get('TWINKLE_TESTS_FORK_SERVER', '1') != '0'
            and sys.platform.startswith('linux')
            and not _cuda_available()
        )

    def run_worker(
        self, model_dir: Path, out: Path, *, nproc: int = 1, extra: tuple[str, ...] = (), worker: Path = WORKER
    ) -> dict:
        if not self.enabled:
            return start_worker(model_dir, out, nproc=nproc, extra=extra, worker=worker)
        from fork_server import ForkServer, ForkServerError

        key = (str(worker), nproc)
        server = self.servers.get(key)
        if server is None or not server.alive:
            try:
                logdir = self.logdir / f'{Path(worker).stem}-{nproc}-{len(self.servers)}'
                server = self.servers[key] = ForkServer(Path(worker), nproc, logdir)
            except ForkServerError as e:
                warnings.warn(f'running {Path(worker).name} without a fork server: {e}', stacklevel=2)
                self.enabled = False
                return start_worker(model_dir, out, nproc=nproc, extra=extra, worker=worker)
        args = ['--model', str(model_dir), '--out', str(out), *extra]
        ok, report = server.run(args, port=free_port() if nproc > 1 else None)
        assert ok, f'{Path(worker).name} {" ".join(args)} ({nproc} rank(s), fork server) failed: {report}'
        return json.loads((Path(out) / 'result.json').read_text())

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        self.servers.clear()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
