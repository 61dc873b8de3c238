"""A throw-away PostgreSQL server for tests: `initdb` into a temporary directory, `pg_ctl start` on a free port
(TCP on 127.0.0.1 and a unix socket in the same directory, trust authentication, durability off), one fresh
database per `create_database`, `stop` removes everything.

The binaries are looked up in `$TWINKLE_PG_BIN`, on `PATH`, then in Debian's `/usr/lib/postgresql/<ver>/bin`
(newest first); `find_bin_dir` returns None when there are none (the tests then skip; `.ci/run` installs Debian's
`postgresql` package). PostgreSQL refuses to run as root: as root, the server runs as `nobody` (`runuser`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

BINARIES = ('initdb', 'pg_ctl', 'postgres')
UNPRIVILEGED_USER = 'nobody'


def find_bin_dir() -> Path | None:
    """A directory holding initdb, pg_ctl and postgres, or None."""
    candidates = []
    if os.environ.get('TWINKLE_PG_BIN'):
        candidates.append(Path(os.environ['TWINKLE_PG_BIN']))
    on_path = shutil.which('pg_ctl')
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    debian = Path('/usr/lib/postgresql')
    if debian.is_dir():
        versions = sorted(
            (p for p in debian.iterdir() if p.name.split('.')[0].isdigit()),
            key=lambda p: [int(x) for x in p.name.split('.') if x.isdigit()],
            reverse=True,
        )
        candidates += [v / 'bin' for v in versions]
    return next((d for d in candidates if all((d / b).is_file() for b in BINARIES)), None)


def why_unavailable() -> str | None:
    """None when a server can be started here, else the reason (for pytest.skip)."""
    if find_bin_dir() is None:
        return (
            'PostgreSQL binaries (initdb, pg_ctl, postgres) not found on PATH, in $TWINKLE_PG_BIN or in '
            '/usr/lib/postgresql/*/bin: apt-get install postgresql (what .ci/run does)'
        )
    if os.geteuid() == 0 and _as_unprivileged() is None:
        return f'running as root without runuser or setpriv (to start PostgreSQL as {UNPRIVILEGED_USER})'
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return 'psycopg is not installed: pip install "twinkle-server[postgres]"'
    return None


def _as_unprivileged() -> list[str] | None:
    """A command prefix running the rest as `UNPRIVILEGED_USER` (runuser, else setpriv), or None."""
    search = os.pathsep.join([os.environ.get('PATH', ''), '/usr/sbin', '/sbin', '/usr/bin', '/bin'])
    runuser, setpriv = shutil.which('runuser', path=search), shutil.which('setpriv', path=search)
    if runuser:
        return [runuser, '-u', UNPRIVILEGED_USER, '--']
    if setpriv:
        user = pwd.getpwnam(UNPRIVILEGED_USER)
        return [setpriv, f'--reuid={user.pw_uid}', f'--regid={user.pw_gid}', '--clear-groups']
    return None


class PostgresServer:
    """One running PostgreSQL instance; `url(db)` connects as the superuser `postgres` without a password."""

    def __init__(self, port: int) -> None:
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise RuntimeError(why_unavailable())
        self.bin_dir, self.port = bin_dir, port
        self.root = Path(tempfile.mkdtemp(prefix='twinkle-pg-'))
        self.data = self.root / 'data'
        self.log = self.root / 'server.log'
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam(UNPRIVILEGED_USER)
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as_user = _as_unprivileged() or []
        self._run(
            'initdb', '-D', str(self.data), '-A', 'trust', '-U', 'postgres', '-E', 'UTF8', '--locale=C', '--no-sync'
        )
        options = (
            f'-p {port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off '
            f'-c synchronous_commit=off -c full_page_writes=off -c max_connections=200'
        )
        self._run('pg_ctl', '-D', str(self.data), '-l', str(self.log), '-w', '-t', '60', '-o', options, 'start')

    def _run(self, binary: str, *args: str) -> None:
        cmd = [*self._as_user, str(self.bin_dir / binary), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root, timeout=120)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ''
            raise RuntimeError(f'{binary} failed ({done.returncode}): {done.stderr[-2000:]}{done.stdout[-500:]}\n{log}')

    def url(self, database: str = 'postgres') -> str:
        return f'postgresql://postgres@127.0.0.1:{self.port}/{database}'

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = name or f'twinkle_{uuid.uuid4().hex[:12]}'
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run('pg_ctl', '-D', str(self.data), '-m', 'immediate', '-w', 'stop')
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
