"""The worker side of `twinkle_agentic.tools.sandbox`: this file, run as ``python -I worker.py MEMORY_MB CPU_S
MAX_PROCESSES FILE_MB MAX_CHARS`` by the parent (inside the call's bwrap sandbox, as PID 2 of its PID namespace),
runs one tool call and waits to be killed. Standard library only until the tool is unpickled.

It limits itself first: RLIMIT_AS (``MEMORY_MB``; a larger allocation is a MemoryError, reported as ``memory``),
RLIMIT_CPU (SIGXCPU at ``CPU_S``), RLIMIT_FSIZE (a larger write fails), no core files, and -- for a non-root user
only, root being exempt -- RLIMIT_NPROC (the user's threads now + 4 x ``MAX_PROCESSES``). It becomes a child
subreaper (orphaned descendants stay in its process tree, where the parent finds and kills them) and dies with the
parent thread that started it. Then it reads two length-prefixed frames from stdin -- JSON ``{"sys_path": [...]}``,
the pickled ``(tool, arguments)`` -- writes ``S`` to stdout once the tool is loaded, calls it, and writes one
length-prefixed JSON reply: ``{"ok": true, "output"}`` or ``{"ok": false, "kind", "message"}``. The tool's own
prints go to stderr (the parent's log file), never into the reply channel.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import signal
import struct
import sys
from typing import IO, Any

from twinkle_core.tool.base import ToolError

FRAME = struct.Struct('>Q')


def truncate(text: str, max_chars: int) -> str:
    """`text`, cut to its first `max_chars` characters plus a marker saying how many were dropped."""
    if len(text) <= max_chars:
        return text
    return f'{text[:max_chars]}\n[... output truncated: {len(text) - max_chars} of {len(text)} characters dropped]'


def _read_frame(stream: IO[bytes]) -> bytes:
    (size,) = FRAME.unpack(stream.read(FRAME.size))
    return stream.read(size)


def _limit(which: int, soft: int, hard: int | None = None) -> None:
    cap = resource.getrlimit(which)[1]
    hard = soft if hard is None else hard
    if cap != resource.RLIM_INFINITY:
        soft, hard = min(soft, cap), min(hard, cap)
    resource.setrlimit(which, (soft, hard))


def _set_limits(memory_mb: int, cpu_s: int, max_processes: int, file_mb: int, parent: int) -> None:
    import ctypes

    if memory_mb:
        _limit(resource.RLIMIT_AS, memory_mb << 20)
    _limit(resource.RLIMIT_CPU, cpu_s, cpu_s + 1)  # SIGXCPU at the soft limit, SIGKILL a second later
    _limit(resource.RLIMIT_FSIZE, file_mb << 20)
    _limit(resource.RLIMIT_CORE, 0)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails instead of killing
    if os.geteuid() != 0:  # RLIMIT_NPROC counts every thread of the user; root is exempt from it
        uid, tasks = os.getuid(), 0
        for pid in filter(str.isdigit, os.listdir('/proc')):
            try:
                tasks += len(os.listdir(f'/proc/{pid}/task')) if os.stat(f'/proc/{pid}').st_uid == uid else 0
            except OSError:
                pass
        _limit(resource.RLIMIT_NPROC, tasks + 4 * max_processes)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def main(argv: list[str]) -> None:
    """Run the call the parent sends on stdin (see the module docstring)."""
    parent = os.getppid()
    memory_mb, cpu_s, max_processes, file_mb, max_chars = map(int, argv)
    out = os.dup(1)  # the reply channel (not inherited by children); the tool's prints go to the log
    os.dup2(2, 1)
    _set_limits(memory_mb, cpu_s, max_processes, file_mb, parent)
    stdin = sys.stdin.buffer
    sys.path[:] = json.loads(_read_frame(stdin))['sys_path']
    reply: dict[str, Any]
    try:
        tool, arguments = pickle.loads(_read_frame(stdin))
    except BaseException as exc:  # noqa: BLE001 - reported
        reply = {'ok': False, 'kind': 'exception', 'message': f'cannot load it: {type(exc).__name__}: {exc}'}
    else:
        os.write(out, b'S')
        me = os.getpid()
        reply = _run(tool, arguments, max_chars)
        if os.getpid() != me:  # a process the tool forked returned from it: only the worker answers
            os._exit(0)
    data = json.dumps(reply).encode()
    data = FRAME.pack(len(data)) + data
    while data:
        data = data[os.write(out, data) :]
    os.read(0, 1)  # wait for the parent to kill the process group (keeping the process tree for it)
    os._exit(0)


def _run(tool: Any, arguments: dict[str, Any], max_chars: int) -> dict[str, Any]:
    try:
        text = tool(**arguments)
        return {'ok': True, 'output': truncate(text if isinstance(text, str) else str(text), max_chars)}
    except ToolError as exc:
        return {'ok': False, 'kind': 'bad_arguments', 'message': str(exc)}
    except MemoryError:
        return {'ok': False, 'kind': 'memory', 'message': ''}
    except BaseException as exc:  # noqa: BLE001 - the tool's failure, reported to the model
        return {'ok': False, 'kind': 'exception', 'message': f'{type(exc).__name__}: {exc}'}


if __name__ == '__main__':
    main(sys.argv[1:])
