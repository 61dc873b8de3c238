"""Run one tool call in a fresh worker process, with a wall-clock timeout and resource limits.

One process per call (``python -I`` on `twinkle_agentic.tools.worker`; 0.1-0.2 s per call here, mostly the interpreter's
start and the tool's imports, so no pool): a worker never outlives its call, so a call cannot leave state, threads or
processes for the next one. The worker starts in a new session (its own process group) with a scrubbed environment --
only PATH, LANG and HOME, HOME being a fresh temporary directory that is also its cwd and is removed after the call --
and gets ``sys.path`` and the pickled ``(tool, arguments)`` on stdin. Tools travel by pickle: classes and `@tool`
functions by import path (the worker imports them from the parent's ``sys.path``), what is not importable (defined in
``__main__``, a closure) by value through cloudpickle when it is installed. The worker limits itself (memory, CPU time,
file size, processes for a non-root user: see `worker`), answers a start byte once the tool is loaded (the timeout
counts from there), then one reply, and waits to be killed.

The parent polls the worker's process tree every 50 ms: more than ``max_processes`` live descendants stop the call
(``killed``; the process-count watchdog, what stops a fork bomb as root, RLIMIT_NPROC not applying to root). Every
call ends the same way, answered or not: SIGSTOP to the whole process group (atomic against fork), SIGKILL to every
descendant that left the group (the worker is a child subreaper, so they stay in its tree), then SIGKILL to the
group: nothing a call started survives it. Not covered (cgroups would be): a process that leaves the group *and*
out-forks the kill loop, a descendant that leaves the group after the worker itself died, and -- as root -- a tool
that raises its own rlimits.
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

from twinkle_agentic.tools import worker
from twinkle_agentic.tools.worker import FRAME, truncate

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
    """Runs tool calls in worker processes (any number at once, one per call); `close` kills those in flight."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self._live: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def run(self, tool: Any, arguments: dict[str, Any], timeout_s: float, name: str | None = None) -> ToolResult:
        """Call ``tool(**arguments)`` in a worker; never raises for what the tool does."""
        name = name or str(getattr(tool, 'name', '?'))
        start = time.monotonic()
        try:
            payload = _payload(tool, arguments)
        except Exception as exc:  # noqa: BLE001 - reported to the caller as a result
            why = f'{type(exc).__name__}: {exc}'
            return failure(name, 'exception', f'tool {name!r} cannot be sent to a sandbox worker ({why}); make it '
                           'importable (or install cloudpickle), or set sandboxed=False')  # fmt: skip
        root = tempfile.mkdtemp(prefix='twinkle-tool-')
        try:
            kind, text = self._call(payload, root, timeout_s)
        finally:
            shutil.rmtree(root, ignore_errors=True)
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
            self._closed, live = True, list(self._live)
        for proc in live:  # the calling thread still reads its output (EOF: killed), then releases it
            _kill_tree(proc)

    def _call(self, payload: bytes, root: str, timeout_s: float) -> tuple[str | None, str]:
        home = os.path.join(root, 'home')
        os.mkdir(home)
        env = {'PATH': os.environ.get('PATH', os.defpath), 'HOME': home, 'LANG': os.environ.get('LANG', 'C.UTF-8')}
        lim = self.limits
        limits = [lim.memory_mb or 0, math.ceil(timeout_s) + 1, lim.max_processes, lim.max_file_mb]
        argv = [sys.executable, '-I', os.path.abspath(worker.__file__), *map(str, limits), str(lim.max_output_chars)]
        log_path = os.path.join(root, 'worker.log')
        with self._lock:
            if self._closed:
                return 'killed', 'the tool manager is closed'
            with open(log_path, 'wb') as log:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=home,
                                        env=env, start_new_session=True)  # fmt: skip
            self._live.add(proc)
        try:
            threading.Thread(target=_feed, args=(proc.stdin, payload), daemon=True).start()
            kind, text = self._await(proc, timeout_s)
        finally:
            _stop(proc)
            with self._lock:
                self._live.discard(proc)
        if kind == 'killed' and not text:
            with open(log_path, 'rb') as log:
                text = 'its worker exited: ' + log.read()[-2000:].decode(errors='replace').strip()
        return kind, text

    def _await(self, proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[str | None, str]:
        """(None, output) or (error kind, detail) from the worker's stdout."""
        assert proc.stdout is not None
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
                if len(_descendants(proc.pid)) > self.limits.max_processes:
                    return 'killed', f'it started more than {self.limits.max_processes} processes'
            if not select.select([fd], [], [], min(_POLL_S, deadline - now))[0]:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return _exit_reason(proc)
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


def _exit_reason(proc: subprocess.Popen[bytes]) -> tuple[str, str]:
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return 'killed', 'its worker closed its output'
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


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """`_kill_tree`, then close the worker's pipes: only by the thread that reads them."""
    _kill_tree(proc)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass


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
