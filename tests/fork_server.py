"""A fork server for worker scripts: the ranks of a world start once, import everything heavy, then fork a fresh child
per run.

`start_worker` (spmd_runner.py) starts every run as new processes (``python worker.py`` or ``torchrun``), and each of
them pays the import of torch, megatron-core and transformers (~10 s per rank on a small machine) before ~1-5 s of
work. A `ForkServer` keeps one server process per rank instead. Each imports the worker module and what it
declares to preload (`preload`: imports only, no torch computation, so no thread pool exists when it forks), then
serves jobs read from stdin, one JSON line each: it forks a child that sets the environment torchrun would (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, and the job's ``MASTER_PORT``; nothing for a one-process world,
like ``python worker.py``), runs the worker's ``main()`` with the job's ``sys.argv``, and exits. The module state a
run changes (Megatron's process groups, torch.distributed, RNGs) lives and dies in the child.

Protocol (server stdout, one JSON line each): ``{"ready": true, "threads": N}`` once after the imports, then per job
``{"pid": P}`` when the child is forked and ``{"rc": R}`` when it exited. The child's stdout and stderr go to the
job's log file. The client (`ForkServer`) picks the port, kills every child of a job as soon as one fails or the
job times out (so a failure never hangs in a collective), and shuts the servers down; each server also dies with
its parent (``PR_SET_PDEATHSIG``), and each child with its server.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

SERVER_ENV = {'OMP_NUM_THREADS': '1'}


def _die_with_parent() -> None:
    """SIGKILL this process when its parent exits (Linux); best effort elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the client's shutdown still ends the servers
        pass


def _threads() -> int:
    try:
        return len(os.listdir('/proc/self/task'))
    except OSError:
        return 1


# ---------------------------------------------------------------------------------------------------- server side


def _child(worker, job: dict, server_pid: int, proto_fd: int) -> None:
    code = 1
    try:
        _die_with_parent()
        if os.getppid() != server_pid:
            os._exit(1)
        os.close(proto_fd)
        log = os.open(job['log'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.environ.update(job['env'])
        sys.argv = [worker.__file__, *job['argv']]
        try:
            worker.main()
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - reported in the log, exit code 1
            import traceback

            traceback.print_exc()
            code = 1
        try:  # the exit hooks a normal interpreter exit runs; not its finalization (freeing gloo from the main thread)
            import atexit

            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def preload(worker) -> None:
    """Import what a run of `worker` would, before the server forks: the modules named by its ``PRELOAD`` and every
    module of the packages in its ``PRELOAD_PACKAGES`` (but those named in ``PRELOAD_SKIP``); missing optional ones
    are skipped. Imports only: no torch computation, so no thread pool exists at the fork."""
    import importlib
    import pkgutil

    modules = list(getattr(worker, 'PRELOAD', ()))
    skip = set(getattr(worker, 'PRELOAD_SKIP', ()))
    for package in getattr(worker, 'PRELOAD_PACKAGES', ()):
        try:
            root = importlib.import_module(package)
        except ImportError:
            continue
        modules += [f'{package}.{m.name}' for m in pkgutil.iter_modules(root.__path__) if m.name not in skip]
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def serve(worker_path: str, rank: int, world: int) -> None:
    _die_with_parent()
    proto_fd = os.dup(1)
    proto = os.fdopen(proto_fd, 'w', buffering=1)
    os.dup2(2, 1)  # anything printed while importing goes to the server's log, never into the protocol
    os.environ.update(SERVER_ENV)
    if world > 1:  # what torchrun sets for every worker (MASTER_PORT comes with each job)
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            GROUP_RANK='0',
            ROLE_RANK=str(rank),
            ROLE_WORLD_SIZE=str(world),
            MASTER_ADDR='127.0.0.1',
        )
    sys.path.insert(0, str(Path(worker_path).parent))  # as when the worker runs as a script
    import importlib.util

    spec = importlib.util.spec_from_file_location('_fork_served_worker', worker_path)
    worker = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = worker
    spec.loader.exec_module(worker)
    preload(worker)
    server_pid = os.getpid()
    proto.write(json.dumps({'ready': True, 'threads': _threads()}) + '\n')
    while True:
        line = sys.stdin.readline()
        if not line or json.loads(line).get('exit'):
            proto.flush()
            os._exit(0)  # nothing to clean up: skip the finalization of torch & co. (seconds per server)
        job = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(worker, job, server_pid, proto_fd)
        proto.write(json.dumps({'pid': pid}) + '\n')
        _, status = os.waitpid(pid, 0)
        proto.write(json.dumps({'rc': os.waitstatus_to_exitcode(status)}) + '\n')


# ---------------------------------------------------------------------------------------------------- client side


class ForkServerError(RuntimeError):
    """The servers are unusable (did not start, died, or are multi-threaded); the caller may run without them."""


class ForkServer:
    """The `nproc` rank servers of `worker`; `run(argv, out)` runs one job on all of them (one at a time)."""

    def __init__(self, worker: Path, nproc: int, logdir: Path, *, start_timeout: float = 600) -> None:
        self.worker, self.nproc, self.logdir = Path(worker), nproc, Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.jobs = 0
        self.procs: list[subprocess.Popen] = []
        self._buf = [b''] * nproc
        env = {**os.environ, **SERVER_ENV}
        for rank in range(nproc):
            with open(self.logdir / f'server{rank}.log', 'wb') as log:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, __file__, str(self.worker), str(rank), str(nproc)],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=log,
                        env=env,
                        cwd=os.getcwd(),
                    )
                )
        try:
            ready = self._collect('ready', range(nproc), time.monotonic() + start_timeout)
        except Exception:
            self.close()
            raise
        if any(r is None for r in ready):
            self.close()
            raise ForkServerError(f'the fork server of {self.worker.name} did not start:\n{self._server_logs()}')
        threads = [r['threads'] for r in ready]
        if any(t != 1 for t in threads):  # forking a multi-threaded process can deadlock the child
            self.close()
            raise ForkServerError(f'the fork server of {self.worker.name} has threads {threads} after its imports')

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def _server_logs(self) -> str:
        return '\n'.join(
            f'--- server rank {r} log ---\n{_tail(self.logdir / f"server{r}.log", 4000)}' for r in range(self.nproc)
        )

    def _collect(self, key: str, ranks, deadline: float, on_message=None) -> list:
        """The next message with `key` from each of `ranks` (None for a rank that died or did not answer in time)."""
        got: dict[int, dict | None] = {}
        pending = set(ranks)
        while pending:
            for r in list(pending):  # whole lines already buffered
                while b'\n' in self._buf[r] and r in pending:
                    line, self._buf[r] = self._buf[r].split(b'\n', 1)
                    msg = json.loads(line)
                    if key in msg:
                        got[r] = msg
                        pending.discard(r)
                        if on_message is not None:
                            on_message(r, msg)
            if not pending:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            fds = {self.procs[r].stdout.fileno(): r for r in pending}
            readable, _, _ = select.select(list(fds), [], [], min(left, 5.0))
            for fd in readable:
                r = fds[fd]
                data = os.read(fd, 65536)
                if data:
                    self._buf[r] += data
                else:  # EOF: the server died
                    got[r] = None
                    pending.discard(r)
                    if on_message is not None:
                        on_message(r, None)
        return [got.get(r) for r in ranks]

    def run(self, argv: list[str], *, port: int | None, timeout: float = 600) -> tuple[bool, str]:
        """Run one job (the worker's ``main()`` with `argv`) on every rank; return (ok, the tails of the ranks'
        stdout+stderr, kept in `logdir`)."""
        if not self.alive:
            raise ForkServerError(f'the fork server of {self.worker.name} is not running:\n{self._server_logs()}')
        self.jobs += 1
        logs = [self.logdir / f'job{self.jobs}-rank{r}.log' for r in range(self.nproc)]
        env = {'MASTER_PORT': str(port)} if port is not None else {}
        for r, proc in enumerate(self.procs):
            proc.stdin.write((json.dumps({'argv': list(argv), 'env': env, 'log': str(logs[r])}) + '\n').encode())
            proc.stdin.flush()
        pids = [m and m['pid'] for m in self._collect('pid', range(self.nproc), time.monotonic() + 60)]
        failed = [] if all(pids) else ['a server did not fork']
        finished: set[int] = set()

        def kill_children() -> None:
            for r, pid in enumerate(pids):
                if pid and r not in finished:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

        def on_rc(r: int, msg: dict | None) -> None:
            finished.add(r)
            if msg is None or msg['rc'] != 0:
                failed.append(f'rank {r} ' + ('lost its server' if msg is None else f'exited with {msg["rc"]}'))
                kill_children()  # the other ranks would wait in a collective for this one

        if failed:
            kill_children()
        rcs = self._collect('rc', range(self.nproc), time.monotonic() + timeout, on_rc)
        if any(m is None for m in rcs) and len(finished) < self.nproc:
            failed.append(f'timed out after {timeout:.0f} s')
            kill_children()
            rest = [r for r in range(self.nproc) if r not in finished]
            if any(m is None for m in self._collect('rc', rest, time.monotonic() + 30, on_rc)):
                self.close()  # a server that does not answer after its child was killed is not reused
        report = '\n'.join(f'--- rank {r} (stdout+stderr) ---\n{_tail(logs[r], 6000)}' for r in range(self.nproc))
        return not failed, ('; '.join(failed) + '\n' + report) if failed else report

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.write(b'{"exit": true}\n')
                proc.stdin.close()
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
        self.procs = []


def _tail(path: Path, n: int) -> str:
    try:
        return Path(path).read_text(errors='replace')[-n:]
    except OSError as e:
        return f'({e})'


if __name__ == '__main__':
    serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
