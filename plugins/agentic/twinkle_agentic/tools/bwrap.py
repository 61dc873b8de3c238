"""The bubblewrap (``bwrap``) command line of one sandboxed tool call, and whether bwrap works on this machine.

`command` wraps a worker's argv so that it runs with new PID, network, mount, IPC, UTS and user namespaces
(``--unshare-all --unshare-user``; nested user namespaces disabled), no capabilities (``--cap-drop ALL``), a new
session, killed with its parent, an empty environment plus ``PATH``, ``HOME=/tmp``, ``LANG``, ``TMPDIR`` and the
variables the tool declares, and a file system made of:

- a read-only root (a tmpfs holding only what follows); a fresh ``/proc`` (this PID namespace's processes only) and
  a minimal ``/dev`` (null, zero, full, random, urandom, tty, pts, shm);
- read-only: ``/usr`` and the ``/bin``, ``/sbin``, ``/lib*`` links or directories; `RUNTIME_ETC` (the dynamic
  linker's cache and configuration, the time zone) -- no other file of ``/etc``, no ``/etc/passwd``; the Python
  runtime (``sys.prefix``, ``sys.base_prefix``, ``sys.exec_prefix``); every entry of the caller's ``sys.path`` but
  its current directory, and the location of every top-level module it has imported (the tool's code and what it
  imports);
- writable, private, sized: ``/tmp`` (the work dir and cwd; ``tmp_mb``) and ``/dev/shm`` (``tmp_mb``), both gone
  with the call;
- what the tool's `Grant` declares: the host network (plus `NETWORK_ETC`) and host paths, read-only or read-write.

`unavailable` says why bwrap cannot be used (missing, or its probe failed), probing once per process.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable

from twinkle_agentic.tools.grant import Grant

__all__ = ['BWRAP_PACKAGE', 'NETWORK_ETC', 'RUNTIME_ETC', 'WORK_DIR', 'command', 'runtime_paths', 'unavailable']

BWRAP_PACKAGE = 'bubblewrap'  # the Debian / Ubuntu / Fedora package that installs /usr/bin/bwrap
WORK_DIR = '/tmp'
RUNTIME_ETC = ('/etc/ld.so.cache', '/etc/ld.so.conf', '/etc/ld.so.conf.d', '/etc/localtime', '/etc/alternatives')
NETWORK_ETC = (
    '/etc/resolv.conf', '/etc/hosts', '/etc/nsswitch.conf', '/etc/host.conf', '/etc/gai.conf', '/etc/ssl',
    '/etc/ca-certificates', '/etc/pki',
)  # fmt: skip
_SYSTEM = ('/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32')
_ISOLATE = ('--unshare-all', '--die-with-parent', '--new-session', '--cap-drop', 'ALL', '--hostname', 'sandbox')
_NO_USERNS = ('--unshare-user', '--disable-userns')  # left out where this bwrap or kernel cannot (then: probed)


def unavailable() -> str | None:
    """None when bwrap runs a sandboxed process here; else why not (naming the package to install)."""
    return _probe()[2]


def command(argv: list[str], grant: Grant, tmp_mb: int) -> list[str]:
    """`argv` wrapped in bwrap as the module docstring describes (`unavailable` must be None)."""
    path, flags, why = _probe()
    assert path is not None, why
    return _command(path, flags, argv, grant, tmp_mb)


def runtime_paths() -> list[str]:
    """Host paths bound read-only for Python: the interpreter's prefixes, the existing ``sys.path`` entries but the
    current directory, and the files or package directories of the imported top-level modules; parents only (a
    path under another is left out), sorted."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    cwd = os.getcwd()
    found.update(os.path.abspath(p) for p in sys.path if p and os.path.abspath(p) != cwd)
    for name, module in list(sys.modules.items()):
        location = getattr(module, '__file__', None) if '.' not in name else None
        if isinstance(location, str) and os.path.isabs(location):
            found.add(os.path.dirname(location) if getattr(module, '__path__', None) else location)
    return _outermost(p for p in found if os.path.exists(p) and not _covered(p, _SYSTEM))


def _command(bwrap: str, flags: tuple[str, ...], argv: list[str], grant: Grant, tmp_mb: int) -> list[str]:
    cmd = [bwrap, *flags]
    for path in _SYSTEM:
        if os.path.islink(path):
            cmd += ['--symlink', os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ['--ro-bind', path, path]
    size = str(max(1, tmp_mb) << 20)
    cmd += ['--proc', '/proc', '--dev', '/dev', '--size', size, '--tmpfs', '/dev/shm', '--size', size]
    cmd += ['--tmpfs', WORK_DIR]  # before the binds: a bound path under /tmp stays visible
    etc = RUNTIME_ETC + (NETWORK_ETC if grant.network else ())
    for path in [*runtime_paths(), *etc]:
        cmd += ['--ro-bind-try', path, path]
    for path in grant.read_only:
        cmd += ['--ro-bind', path, path]
    for path in grant.read_write:
        cmd += ['--bind', path, path]
    if grant.network:
        cmd.append('--share-net')
    cmd += ['--remount-ro', '/', '--chdir', WORK_DIR, '--clearenv']
    env = {'PATH': '/usr/local/bin:/usr/bin:/bin', 'HOME': WORK_DIR, 'TMPDIR': WORK_DIR, 'LANG': 'C.UTF-8'}
    env.update((name, os.environ[name]) for name in grant.env if name in os.environ)
    for name, value in env.items():
        cmd += ['--setenv', name, value]
    return [*cmd, '--', *argv]


@functools.cache
def _probe() -> tuple[str | None, tuple[str, ...], str | None]:
    """(bwrap's path, its flags, None) once a trivial sandboxed Python ran here, else (None, (), why)."""
    path = shutil.which('bwrap')
    if path is None:
        return (
            None,
            (),
            f'bwrap is not installed (install the `{BWRAP_PACKAGE}` package: apt-get install {BWRAP_PACKAGE})',
        )
    errors = []
    for flags in (_ISOLATE + _NO_USERNS, _ISOLATE):
        argv = [sys.executable, '-I', '-S', '-c', 'pass']
        try:
            done = subprocess.run(_command(path, flags, argv, Grant(), 1), capture_output=True, timeout=30, env={})
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(f'{type(exc).__name__}: {exc}')
            continue
        if done.returncode == 0:
            return path, flags, None
        errors.append(done.stderr.decode(errors='replace').strip()[-300:])
    return None, (), f'{path} cannot create a sandbox on this machine ({"; ".join(errors)})'


def _covered(path: str, roots: tuple[str, ...] | list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip('/') + '/') for r in roots)


def _outermost(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count('/'), p)):
        if not _covered(path, out):
            out.append(path)
    return sorted(out)
