"""Run one tool call in a fresh worker process inside a bubblewrap sandbox, with a wall-clock timeout and limits.

One sandbox per call (`twinkle_agentic.tools.bwrap`: new PID, network, mount, IPC, UTS and user namespaces, no
capabilities, an empty environment, a read-only file system holding only the Python runtime and the caller's code,
a private sized ``/tmp``, and what the tool's `Grant` declares), in it ``python -I`` on
`twinkle_agentic.tools.worker`; about 0.3 s per call on a busy 2-core machine, bwrap's share about 0.02 s, the rest
the interpreter's start and the tool's imports, so no pool: nothing of a call is left for the next one. The worker
gets ``sys.path`` and the pickled ``(tool, arguments)`` on stdin. Tools travel by pickle: classes and `@tool`
functions by import path (the worker imports them from the parent's ``sys.path``, bound read-only), what is not
importable (defined in ``__main__``, a closure) by value through cloudpickle when it is installed. The worker
limits itself (memory, CPU time, file size: see `worker`), answers a start byte once the tool is loaded (the timeout
counts from there), then one reply, and waits to be killed.

Whole-call bounds: where this process may create cgroups (`twinkle_agentic.tools.cgroup`) each call gets its own,
joined before bwrap starts: ``memory_mb`` for all its processes together (the kernel's OOM killer; a call whose
worker it killed reports ``memory``) and at most `max_tasks` tasks (threads count). Elsewhere only the per-process
rlimits of `worker` hold (RLIMIT_AS is per process: N processes may hold N x ``memory_mb``). Either way the parent
polls the call's process tree every 50 ms: more than ``max_processes`` processes of the tool stop the call
(``killed``). Every call ends the same way, answered or not: SIGKILL to the PID namespace's init, which makes the
kernel kill every process of the namespace -- a process that left the session or was re-parented included -- then
the cgroup (if any) is emptied and removed: nothing a call started survives it.

Without bwrap (`allow_unsandboxed`, for trusted tools only) the worker runs as a plain process: its own process
group, an environment of PATH, LANG and HOME only (HOME a fresh temporary directory, also its cwd), the same rlimits
and cgroup, and the host's file system, network and /proc (where a tool can read other processes' environments).
It ends with SIGSTOP to its process group, SIGKILL to descendants that left it (the worker is a child subreaper),
then SIGKILL to the group and to the cgroup's processes.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from twinkle_agentic.tools import bwrap, worker
from twinkle_agentic.tools.cgroup import CallCgroup
from twinkle_agentic.tools.grant import Grant, grant_of
from twinkle_agentic.tools.worker import FRAME, truncate
from twinkle_core.errors import TwinkleError

__all__ = ['ERROR_KINDS', 'Sandbox', 'SandboxLimits', 'ToolResult', 'failure', 'truncate']

ERROR_KINDS = frozenset({'unknown_tool', 'bad_arguments', 'exception', 'timeout', 'memory', 'killed'})
_POLL_S = 0.05
_MAX_REPLY_BYTES = 64 << 20


@dataclass
class ToolResult:
    """One tool call's outcome. `output`: the text the model sees (the tool's answer, or a message starting with
    'Error:'); `ok`: the tool answered; `error`: None, or the kind of failure (one of `ERROR_KINDS`)."""

    name: str
    output: str
    ok: bool = True
    error: str | None = None
    elapsed_s: float = 0.0


def failure(name: str, kind: str, message: str, elapsed_s: float = 0.0) -> ToolResult:
    """A failed call: `output` is ``'Error: ' + message``."""
    assert kind in ERROR_KINDS, kind
    return ToolResult(name, f'Error: {message}', ok=False, error=kind, elapsed_s=elapsed_s)


@dataclass(frozen=True)
class SandboxLimits:
    """Per-call limits. `memory_mb`: address space of each process (None: unlimited); `max_processes`: live
    descendants of the worker; `max_output_chars`: the answer's length; `max_file_mb`: size of a file written;
    `start_timeout_s`: time to start the worker and load the tool (not counted in the tool's timeout)."""

    memory_mb: int | None = 1024
    max_processes: int = 16
    max_output_chars: int = 4096
    max_file_mb: int = 256
    start_timeout_s: float = 60.0


class Sandbox:
    """Runs tool calls in sandboxed worker processes (any number at once, one per call); `close` kills those in
    flight. `allow_unsandboxed`: where bwrap is unusable, run workers as plain processes instead of refusing."""

    def __init__(self, limits: SandboxLimits | None = None, *, allow_unsandboxed: bool = False) -> None:
        self.limits = limits or SandboxLimits()
        self.allow_unsandboxed = allow_unsandboxed
        self._live: dict[subprocess.Popen[bytes], bool] = {}  # worker -> isolated
        self._lock = threading.Lock()
        self._closed = False

    @property
    def isolated(self) -> bool:
        """Whether calls run under bwrap (False: bwrap is unusable here; see `unavailable`)."""
        return bwrap.unavailable() is None

    @staticmethod
    def unavailable() -> str | None:
        """None when calls can be sandboxed; else why not, naming what to install and the opt-in."""
        why = bwrap.unavailable()
        if why is None:
            return None
        return (
            f'cannot sandbox tool calls: {why}. Install it, or pass allow_unsandboxed=True to run trusted tools as '
            "plain processes (no namespaces: such a tool can read this host's files, network and processes)"
        )

    def run(self, tool: Any, arguments: dict[str, Any], timeout_s: float, name: str | None = None) -> ToolResult:
        """Call ``tool(**arguments)`` in a worker; never raises for what the tool does."""
        name = name or str(getattr(tool, 'name', '?'))
        start = time.monotonic()
        why = self.unavailable()
        if why is not None and not self.allow_unsandboxed:
            return failure(name, 'exception', f'tool {name!r} was not run: {why}')
        try:
            grant = grant_of(tool)
            payload = _payload(tool, arguments)
        except TwinkleError as exc:
            return failure(name, 'exception', str(exc))
        except Exception as exc:  # noqa: BLE001 - reported to the caller as a result
            why = f'{type(exc).__name__}: {exc}'
            return failure(name, 'exception', f'tool {name!r} cannot be sent to a sandbox worker ({why}); make it '
                           'importable (or install cloudpickle), or set sandboxed=False')  # fmt: skip
        kind, text = self._call(payload, grant, timeout_s)
        elapsed = time.monotonic() - start
        if kind is None:
            return ToolResult(name, text, elapsed_s=elapsed)
        messages = {
            'timeout': f'tool {name!r} timed out ' + (text or f'after {timeout_s:.1f} s'),
            'memory': f'tool {name!r} ran out of memory (limit {self.limits.memory_mb} MiB)',
            'exception': f'tool {name!r} failed: {text}',
            'killed': f'tool {name!r} was stopped: {text}',
        }
        message = text if kind == 'bad_arguments' else messages[kind]
        return failure(name, kind, truncate(message, self.limits.max_output_chars), elapsed)

    def close(self) -> None:
        """Kill the workers in flight (their calls report ``killed``); later calls are refused."""
        with self._lock:
            self._closed, live = True, list(self._live.items())
        for proc, isolated in live:  # the calling thread still reads its output (EOF: killed), then releases it
            _terminate(proc, isolated)

    def _call(self, payload: bytes, grant: Grant, timeout_s: float) -> tuple[str | None, str]:
        lim = self.limits
        limits = [lim.memory_mb or 0, math.ceil(timeout_s) + 1, lim.max_processes, lim.max_file_mb]
        argv = [sys.executable, '-I', os.path.abspath(worker.__file__), *map(str, limits), str(lim.max_output_chars)]
        isolated = self.isolated
        home = None
        if isolated:
            argv, env, cwd = bwrap.command(argv, grant, lim.max_file_mb), {}, None
        else:
            home = cwd = tempfile.mkdtemp(prefix='twinkle-tool-')
            env = {'PATH': os.environ.get('PATH', os.defpath), 'HOME': home, 'LANG': os.environ.get('LANG', 'C.UTF-8')}
        cgroup = CallCgroup.create(lim.memory_mb, max_tasks(lim.max_processes))
        if cgroup is not None:  # the shell joins the call's cgroup, then execs bwrap (or the worker)
            files = cgroup.procs_files
            join = ' && '.join(f'echo $$ > "${i + 1}"' for i in range(len(files)))
            argv = ['/bin/sh', '-c', f'{join} && shift {len(files)} && exec "$@"', 'sh', *files, *argv]
        try:
            with tempfile.TemporaryFile() as log:
                with self._lock:
                    if self._closed:
                        return 'killed', 'the tool manager is closed'
                    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=cwd,
                                            env=env, start_new_session=True)  # fmt: skip
                    self._live[proc] = isolated
                try:
                    threading.Thread(target=_feed, args=(proc.stdin, payload), daemon=True).start()
                    kind, text = self._await(proc, timeout_s, isolated)
                finally:
                    _end(proc, isolated)
                    with self._lock:
                        self._live.pop(proc, None)
                if kind == 'killed' and cgroup is not None and cgroup.oom_kills():
                    return 'memory', ''
                if kind == 'killed' and not text:
                    log.seek(0)
                    text = 'its worker exited: ' + log.read()[-2000:].decode(errors='replace').strip()
                return kind, text
        finally:
            if cgroup is not None:
                cgroup.remove()
            if home is not None:
                shutil.rmtree(home, ignore_errors=True)

    def _await(self, proc: subprocess.Popen[bytes], timeout_s: float, isolated: bool) -> tuple[str | None, str]:
        """(None, output) or (error kind, detail) from the worker's stdout. `isolated`: `proc` is bwrap (then its
        init and the worker are no processes of the tool's)."""
        assert proc.stdout is not None
        overhead = 2 if isolated else 0
        fd, buf = proc.stdout.fileno(), bytearray()
        started: float | None = None
        deadline = time.monotonic() + self.limits.start_timeout_s
        checked = 0.0
        while True:
            now = time.monotonic()
            if now >= deadline:
                if started is None:
                    return 'timeout', f'(its worker did not start within {self.limits.start_timeout_s:.0f} s)'
                return 'timeout', ''
            if started is not None and now - checked >= _POLL_S:
                checked = now
                if len(_descendants(proc.pid)) - overhead > self.limits.max_processes:
                    return 'killed', f'it started more than {self.limits.max_processes} processes'
            if not select.select([fd], [], [], min(_POLL_S, deadline - now))[0]:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return _exit_reason(proc, isolated)
            buf += chunk
            if started is None and buf[:1] == b'S':
                started, deadline = time.monotonic(), time.monotonic() + timeout_s
                del buf[:1]
            if len(buf) >= FRAME.size:
                (size,) = FRAME.unpack_from(buf)
                if size > _MAX_REPLY_BYTES:
                    return 'killed', 'its worker sent a malformed reply'
                if len(buf) >= FRAME.size + size:
                    reply = json.loads(bytes(buf[FRAME.size : FRAME.size + size]))
                    return (None, reply['output']) if reply['ok'] else (reply['kind'], reply['message'])


def max_tasks(max_processes: int) -> int:
    """The task limit of a call's cgroup: room for `max_processes` processes of a few threads each and a thread
    per CPU twice over (numerical libraries start one per core at import); the watchdog stops the call earlier."""
    return 4 * max_processes + 2 * (os.cpu_count() or 1) + 8


def _payload(tool: Any, arguments: dict[str, Any]) -> bytes:
    """sys.path and the pickled (tool, arguments): plain pickle when the tool pickles by references the worker can
    import, else cloudpickle (by value; needed for ``__main__`` and local objects)."""
    head = json.dumps({'sys_path': [os.path.abspath(p) if p else os.getcwd() for p in sys.path]}).encode()
    try:
        plain: bytes | None = pickle.dumps(tool, protocol=5)
    except (pickle.PicklingError, TypeError, AttributeError):
        plain = None
    if plain is None or b'__main__' in plain:  # the worker's __main__ is worker.py: such references fail there
        try:
            import cloudpickle
        except ImportError:
            if plain is None:
                raise
        else:
            body = cloudpickle.dumps((tool, arguments), protocol=5)
            return FRAME.pack(len(head)) + head + FRAME.pack(len(body)) + body
    body = pickle.dumps((tool, arguments), protocol=5)
    return FRAME.pack(len(head)) + head + FRAME.pack(len(body)) + body


def _feed(stream: IO[bytes], payload: bytes) -> None:
    try:
        stream.write(payload)
        stream.flush()
    except (BrokenPipeError, ValueError, OSError):
        pass  # the worker died; the reader sees why


def _exit_reason(proc: subprocess.Popen[bytes], isolated: bool) -> tuple[str, str]:
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return 'killed', 'its worker closed its output'
    if isolated and code - 128 in signal.valid_signals():  # bwrap exits with 128 + the signal that ended the worker
        code = 128 - code
    if code == -signal.SIGXCPU:
        return 'timeout', '(it used up its CPU time limit)'
    if code < 0:
        return 'killed', f'its worker died of signal {signal.Signals(-code).name}'
    return 'killed', ''


def _kill(pid: int, sig: int) -> None:
    """`os.kill` (a negative `pid`: the process group), ignoring processes already gone."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of `pid`, None if gone."""
    try:
        with open(f'/proc/{pid}/stat', 'rb') as f:
            fields = f.read().rpartition(b')')[2].split()
        return fields[0].decode(), int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def _descendants(pid: int) -> list[int]:
    """Live (non-zombie) descendants of `pid`, from /proc/PID/task/TID/children."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f'/proc/{parent}/task')
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f'/proc/{parent}/task/{tid}/children', 'rb') as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            for child in children:
                stat = _stat(child)
                if stat is not None and stat[0] != 'Z':
                    out.append(child)
                    todo.append(child)
    return out


def _terminate(proc: subprocess.Popen[bytes], isolated: bool) -> None:
    """Kill everything the call started (`_kill_namespace` under bwrap, else `_kill_tree`) and reap the worker."""
    if isolated:
        _kill_namespace(proc)
    else:
        _kill_tree(proc)


def _end(proc: subprocess.Popen[bytes], isolated: bool) -> None:
    """`_terminate`, then close the worker's pipes: only by the thread that reads them."""
    _terminate(proc, isolated)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


def _kill_namespace(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL bwrap's init in the call's PID namespace -- the kernel then kills every process of the namespace,
    and the init is gone only once they are -- and reap bwrap, which exits with it. Should bwrap not have made the
    namespace yet or not exit within 5 s, SIGKILL bwrap (its ``--die-with-parent`` kills the init)."""
    deadline = time.monotonic() + 5
    while True:
        for pid in _children(proc.pid):
            _kill(pid, signal.SIGKILL)
        try:
            proc.wait(timeout=_POLL_S)
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                _kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return


def _children(pid: int) -> list[int]:
    try:
        with open(f'/proc/{pid}/task/{pid}/children', 'rb') as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Freeze the worker's process group, kill the descendants that left it, kill the group, reap the worker and
    wait (up to 5 s) until every process killed is gone."""
    group = proc.pid
    _kill(-group, signal.SIGSTOP)
    for _ in range(1000):
        strays = [p for p in _descendants(proc.pid) if (_stat(p) or ('', group))[1] != group]
        if not strays:
            break
        for pid in strays:
            _kill(pid, signal.SIGKILL)
    killed = _descendants(proc.pid)
    _kill(-group, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any((_stat(p) or ('Z', 0))[0] != 'Z' for p in killed) and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.wait()
