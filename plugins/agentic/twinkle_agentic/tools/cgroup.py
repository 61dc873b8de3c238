"""One tool call's control group: a memory limit (memory plus swap) and a task limit for everything the call
starts, together -- where this machine lets this process create a child of its own cgroup.

cgroup v2: a child of this process's cgroup, used when that cgroup delegates the ``memory`` controller to its
children (``cgroup.subtree_control``); ``memory.max``, ``memory.swap.max = 0``, ``pids.max``. cgroup v1: a child of
this process's cgroup in the ``memory`` hierarchy (``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``
where swap is accounted) and, when mounted, the ``pids`` hierarchy (``pids.max``). Elsewhere `CallCgroup.create`
returns None and the sandbox falls back to per-process rlimits (see `twinkle_agentic.tools.sandbox`).

A process joins the call's cgroup by writing its own pid to each of `procs_files` before it starts anything (the
sandbox does it in a shell that then execs bwrap), so nothing of the call runs outside it. The memory limit is
enforced by the kernel's OOM killer inside the cgroup; `oom_kills` counts its kills.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass

__all__ = ['CallCgroup', 'support']

_PREFIX = 'twinkle-tool-'


@dataclass(frozen=True)
class _Hierarchy:
    version: int  # 1 or 2
    controller: str  # 'memory' or 'pids' ('memory' for v2: both)
    parent: str  # the directory under which calls' cgroups are made


class CallCgroup:
    """The cgroup directories of one call (one per hierarchy)."""

    def __init__(self, dirs: list[tuple[_Hierarchy, str]]) -> None:
        self._dirs = dirs

    @classmethod
    def create(cls, memory_mb: int | None, max_tasks: int) -> CallCgroup | None:
        """A new cgroup limited to `memory_mb` MiB (None: unlimited) and `max_tasks` tasks (threads included);
        None where this machine allows none (see `support`)."""
        hierarchies = _hierarchies()
        if not hierarchies:
            return None
        name = f'{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}'
        made: list[tuple[_Hierarchy, str]] = []
        try:
            for h in hierarchies:
                path = os.path.join(h.parent, name)
                os.mkdir(path)
                made.append((h, path))
                _configure(h, path, memory_mb, max_tasks)
        except OSError:
            CallCgroup(made).remove()
            return None
        return cls(made)

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to join this cgroup."""
        return [os.path.join(path, 'cgroup.procs') for _, path in self._dirs]

    def oom_kills(self) -> int:
        """How many processes of the call the OOM killer killed for its memory limit."""
        for h, path in self._dirs:
            if h.controller == 'memory':
                name = 'memory.events' if h.version == 2 else 'memory.oom_control'
                return _field(os.path.join(path, name), 'oom_kill')
        return 0

    def pids(self) -> set[int]:
        """The processes in the cgroup."""
        out: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError):
                with open(procs) as f:
                    out.update(int(line) for line in f if line.strip())
        return out

    def kill(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until none is left (up to `timeout_s`); True when none is."""
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() >= deadline:
                return False
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and remove the directories (best effort: a directory still busy is left)."""
        self.kill()
        for _, path in reversed(self._dirs):
            for _ in range(100):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def support() -> str:
    """What bounds a whole call here, in words: the cgroup hierarchies used, or that there are none."""
    hierarchies = _hierarchies()
    if not hierarchies:
        return 'none (no cgroup this process may create children in: per-process rlimits only)'
    return ', '.join(f'cgroup v{h.version} {h.controller}' for h in hierarchies)


@functools.cache
def _hierarchies() -> tuple[_Hierarchy, ...]:
    """The hierarchies where a trial child cgroup could be made and configured (probed once per process)."""
    found: list[_Hierarchy] = []
    v2 = _own_dir('cgroup2', None)
    if v2 is not None and {'memory', 'pids'} <= set(_read(os.path.join(v2, 'cgroup.subtree_control')).split()):
        found.append(_Hierarchy(2, 'memory', v2))
    else:
        for controller in ('memory', 'pids'):
            path = _own_dir('cgroup', controller)
            if path is not None:
                found.append(_Hierarchy(1, controller, path))
    usable = []
    for h in found:
        _sweep(h.parent)
        trial = os.path.join(h.parent, f'{_PREFIX}{os.getpid()}-probe-{uuid.uuid4().hex[:8]}')
        try:
            os.mkdir(trial)
        except OSError:
            continue
        try:
            _configure(h, trial, 64, 8)
            usable.append(h)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(trial)
    if not any(h.controller == 'memory' for h in usable):
        return ()
    return tuple(usable)


def _configure(h: _Hierarchy, path: str, memory_mb: int | None, max_tasks: int) -> None:
    if h.version == 2:
        if memory_mb:
            _write(os.path.join(path, 'memory.max'), str(memory_mb << 20))
            with contextlib.suppress(OSError):
                _write(os.path.join(path, 'memory.swap.max'), '0')
        _write(os.path.join(path, 'pids.max'), str(max_tasks))
    elif h.controller == 'memory':
        if memory_mb:
            _write(os.path.join(path, 'memory.limit_in_bytes'), str(memory_mb << 20))
            with contextlib.suppress(OSError):  # absent or refused where swap is not accounted
                _write(os.path.join(path, 'memory.memsw.limit_in_bytes'), str(memory_mb << 20))
    else:
        _write(os.path.join(path, 'pids.max'), str(max_tasks))


def _own_dir(fstype: str, controller: str | None) -> str | None:
    """This process's cgroup directory in the hierarchy mounted with `fstype` (and, for v1, `controller`)."""
    own = None
    for line in _read('/proc/self/cgroup').splitlines():
        number, controllers, path = line.split(':', 2)
        if (fstype == 'cgroup2' and number == '0' and not controllers) or (
            fstype == 'cgroup' and controller in controllers.split(',')
        ):
            own = path
    if own is None:
        return None
    for line in _read('/proc/self/mountinfo').splitlines():
        fields = line.split()
        sep = fields.index('-')
        root, mount, kind, options = fields[3], fields[4], fields[sep + 1], fields[sep + 3]
        if kind != fstype or (controller is not None and controller not in options.split(',')):
            continue
        relative = os.path.relpath(own, root)
        if relative.startswith('..'):
            continue
        path = os.path.normpath(os.path.join(mount, relative))
        if os.path.isdir(path):
            return path
    return None


def _sweep(parent: str) -> None:
    """Remove the calls' cgroups left by processes that died (empty ones only)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            pid = name[len(_PREFIX) :].split('-', 1)[0]
            if name.startswith(_PREFIX) and pid.isdigit() and not os.path.exists(f'/proc/{pid}'):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(parent, name))


def _field(path: str, key: str) -> int:
    for line in _read(path).splitlines():
        name, _, value = line.partition(' ')
        if name == key:
            return int(value)
    return 0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ''


def _write(path: str, value: str) -> None:
    with open(path, 'w') as f:
        f.write(value)
