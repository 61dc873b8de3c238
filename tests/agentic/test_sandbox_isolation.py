"""The tool sandbox as a hostile tool meets it (issue 46, defects 1-6), through `ToolManager` as a rollout calls it:
no secret of the caller's environment or /proc, no network but what a tool declares, nothing a call started
outlives it, no host file but the runtime and what a tool declares, memory bounded for the whole call, and a
calculator bounded in work. Without bubblewrap a sandboxed tool is refused unless `allow_unsandboxed`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from twinkle_agentic.tools import PythonTool, ToolManager, bwrap, cgroup, tool
from twinkle_core.errors import TwinkleError

needs_bwrap = pytest.mark.skipif(
    bwrap.unavailable() is not None, reason=f'needs a working bwrap (Debian package {bwrap.BWRAP_PACKAGE})'
)


@tool
def peek_environ() -> str:
    """Everything this process can read of environments: its own, its parent's and every /proc/*/environ."""
    seen = {'self': json.dumps(dict(os.environ))}
    paths = [f'/proc/{os.getppid()}/environ'] + [f'/proc/{p}/environ' for p in os.listdir('/proc') if p.isdigit()]
    for path in paths:
        try:
            with open(path, 'rb') as f:
                seen[path] = f.read().decode(errors='replace')
        except OSError as exc:
            seen[path] = type(exc).__name__
    return json.dumps(seen)


def python_tool(**grants: object) -> PythonTool:
    """The built-in `python` tool with the grants declared on the instance."""
    instance = PythonTool()
    for key, value in grants.items():
        setattr(instance, key, value)
    return instance


@needs_bwrap
def test_a_tool_cannot_read_the_callers_environment() -> None:
    """The caller is a process started with a secret in its environment (what /proc/PID/environ shows is the
    environment a process started with, so it runs in a child process): neither a tool in its worker nor a program
    of the `python` tool finds the secret in its own environment, its parent's or any /proc/*/environ; a variable
    the tool declares reaches it."""
    secret = f'tw-secret-{uuid.uuid4().hex}'
    caller = """
import json
from test_sandbox_isolation import peek_environ, peek_environ_code, python_tool
from twinkle_agentic.tools import ToolManager

peek = python_tool(env=['TWINKLE_PUBLIC_SETTING'])
with ToolManager([peek_environ, peek], memory_mb=256, timeout_s=8, max_output_chars=10**6) as tm:
    results = [tm.call('peek_environ', {}), tm.call('python', {'code': peek_environ_code()})]
print(json.dumps([[r.ok, r.output] for r in results]))
"""
    env = {**os.environ, 'TWINKLE_API_KEY': secret, 'TWINKLE_PUBLIC_SETTING': 'shown'}
    env['PYTHONPATH'] = os.pathsep.join([str(Path(__file__).parent), env.get('PYTHONPATH', '')])
    done = subprocess.run([sys.executable, '-c', caller], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    (worker_ok, in_worker), (program_ok, in_program) = json.loads(done.stdout.splitlines()[-1])
    assert worker_ok and program_ok, (in_worker, in_program)
    assert secret not in in_worker and secret not in in_program
    assert len(json.loads(in_worker)) > 2  # it did read /proc/*/environ: its own namespace's
    assert json.loads(json.loads(in_program)['self'])['TWINKLE_PUBLIC_SETTING'] == 'shown'  # declared


def peek_environ_code() -> str:
    """`peek_environ`'s body as a program for the `python` tool."""
    import inspect

    body = inspect.getsource(peek_environ.fn).split('"""', 2)[2]
    return 'import json, os\n\ndef peek():' + body + '\n\nprint(peek())\n'


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server on the host's 127.0.0.1 answering b'pong' to each connection; yields its port."""
    server = socket.create_server(('127.0.0.1', 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b'pong')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


@needs_bwrap
def test_a_tool_reaches_no_network_unless_it_declares_it(listener: int) -> None:
    code = (
        'import socket\ntry:\n'
        f"    print('answered', socket.create_connection(('127.0.0.1', {listener}), timeout=3).recv(4))\n"
        'except OSError as exc:\n    print(type(exc).__name__)\n'
    )
    with ToolManager(['python'], timeout_s=8) as tm:
        assert tm.call('python', {'code': code}).output == 'ConnectionRefusedError\n'  # its own loopback
    with ToolManager([python_tool(network=True)], timeout_s=8) as tm:
        assert tm.call('python', {'code': code}).output == "answered b'pong'\n"


@needs_bwrap
def test_a_function_tool_reaches_the_network_only_when_it_declares_it_with_the_decorator(listener: int) -> None:
    """``@tool(network=True)`` is the declaration the manager grants: that tool reaches a listener on the host's
    127.0.0.1, the same function undeclared meets only its own loopback."""

    def connect(port: int) -> str:
        """Connect to the host's 127.0.0.1:port and read its answer."""
        import socket

        try:
            return 'answered ' + socket.create_connection(('127.0.0.1', port), timeout=3).recv(4).decode()
        except OSError as exc:
            return type(exc).__name__

    declared = tool(name='declared', network=True)(connect)
    undeclared = tool(name='undeclared')(connect)
    assert (declared.network, undeclared.network) == (True, False)
    with ToolManager([declared, undeclared], timeout_s=8) as tm:
        results = tm.call_many([('declared', {'port': listener}), ('undeclared', {'port': listener})])
    assert [r.output for r in results] == ['answered pong', 'ConnectionRefusedError']


@needs_bwrap
def test_a_function_tool_reads_only_the_paths_it_declares_with_the_decorator(tmp_path: Path) -> None:
    """``@tool(paths=[(dir, 'ro')])``: a host file in `dir` is readable, not writable; undeclared, it is not there."""
    shared = tmp_path / 'shared'
    shared.mkdir()
    (shared / 'input.txt').write_text('declared input')

    def read_and_write(directory: str) -> str:
        """Read directory/input.txt, then try to write directory/out.txt."""
        import os

        try:
            text = open(os.path.join(directory, 'input.txt')).read()
        except OSError as exc:
            return f'read {type(exc).__name__}'
        try:
            open(os.path.join(directory, 'out.txt'), 'w').close()
            return f'read {text!r}, wrote'
        except OSError as exc:
            return f'read {text!r}, write {type(exc).__name__}'

    declared = tool(name='declared', paths=[(str(shared), 'ro')])(read_and_write)
    undeclared = tool(name='undeclared')(read_and_write)
    assert declared.paths == ((str(shared), 'ro'),)
    with ToolManager([declared, undeclared], timeout_s=8) as tm:
        results = tm.call_many([('declared', {'directory': str(shared)}), ('undeclared', {'directory': str(shared)})])
    assert [r.output for r in results] == ["read 'declared input', write OSError", 'read FileNotFoundError']
    assert os.listdir(shared) == ['input.txt']


@needs_bwrap
def test_nothing_a_call_started_survives_it(tmp_path: Path) -> None:
    """The issue's reproduction: fork, the child setsid()s and forks a grandchild that writes a heartbeat, then the
    program kills its own worker. The call ends `killed` and the heartbeat stops with it."""
    beat = tmp_path / 'heartbeat'
    code = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        end = time.monotonic() + 20  # bounded, should it escape (it did before the sandbox)
        while time.monotonic() < end:
            with open({str(beat)!r}, 'a') as f:
                f.write('.')
            time.sleep(0.05)
    os._exit(0)
while not os.path.exists({str(beat)!r}):
    time.sleep(0.01)
os.kill(os.getppid(), 9)
time.sleep(30)
"""
    with ToolManager([python_tool(paths=[(str(tmp_path), 'rw')])], timeout_s=15) as tm:
        result = tm.call('python', {'code': code})
    assert (result.ok, result.error) == (False, 'killed'), result
    assert result.elapsed_s < 10
    size = beat.stat().st_size
    assert size > 0
    time.sleep(0.5)  # ten heartbeats, were the grandchild alive
    assert beat.stat().st_size == size


@needs_bwrap
def test_a_tool_sees_no_host_file_but_the_runtime_and_what_it_declares(tmp_path: Path) -> None:
    secret = tmp_path / 'secret.txt'
    secret.write_text('host secret')
    shared = tmp_path / 'shared'
    shared.mkdir()
    (shared / 'input.txt').write_text('declared input')
    escape = f'/tmp/twinkle-escape-{uuid.uuid4().hex}'
    code = f"""
import os
for path in ['/etc/passwd', {str(secret)!r}, {str(shared / 'input.txt')!r}]:
    try:
        print(path, open(path).read())
    except OSError as exc:
        print(path, type(exc).__name__)
for path in [{str(tmp_path / 'written')!r}, {escape!r}, '/written', {str(shared / 'out')!r}, 'local']:
    try:
        with open(path, 'wb') as f:
            f.write(b'x' * (16 << 20))
        print(path, 'written')
    except OSError as exc:
        print(path, type(exc).__name__)
print('capabilities', open('/proc/self/status').read().split('CapEff:')[1].split()[0])
"""
    with ToolManager([python_tool(paths=[str(shared)])], timeout_s=8) as tm:
        lines = tm.call('python', {'code': code}).output.splitlines()
    assert lines == [
        '/etc/passwd FileNotFoundError',
        f'{secret} FileNotFoundError',
        f'{shared / "input.txt"} declared input',  # declared read-only
        f'{tmp_path / "written"} written',  # in the sandbox's /tmp (holding the path to shared/), not the host's
        f'{escape} written',  # the sandbox's own /tmp
        '/written OSError',  # read-only root
        f'{shared / "out"} OSError',  # read-only
        'local written',  # cwd: /tmp
        'capabilities 0000000000000000',  # none, also as root
    ]
    assert not os.path.exists(escape) and sorted(os.listdir(tmp_path)) == ['secret.txt', 'shared']
    assert os.listdir(shared) == ['input.txt']


@needs_bwrap
def test_memory_is_bounded_for_the_whole_call() -> None:
    """memory_mb=256 and four child processes of 200 MiB each: under the call's cgroup they cannot all hold their
    memory at once (each alone is under the per-process limit)."""
    if cgroup.support().startswith('none'):
        pytest.skip('no cgroup here: only per-process limits (tests/agentic/test_sandbox.py)')
    code = """
import subprocess, sys
child = "import time; x = b'1' * (200 << 20); time.sleep(3)"
children = [subprocess.Popen([sys.executable, '-c', child]) for _ in range(4)]
print([c.wait() for c in children])
"""
    with ToolManager(['python'], memory_mb=256, timeout_s=20) as tm:
        result = tm.call('python', {'code': code})
    assert result.error == 'memory' or '-9' in result.output, result
    assert result.output != '[0, 0, 0, 0]\n'


def test_the_calculator_is_bounded_and_never_stalls_the_caller() -> None:
    gaps: list[float] = []
    stop = threading.Event()

    def heartbeat() -> None:
        last = time.monotonic()
        while not stop.wait(0.05):
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    beating = threading.Thread(target=heartbeat, daemon=True)
    beating.start()
    time.sleep(0.2)
    worst = ['round(1, -10**7)', 'round(2**4095, -10**6)', 'round(1.5, 10**9)', '9**9**9', '(2**4095) * (2**4095)']
    with ToolManager(['calculator'], timeout_s=2) as tm:
        start = time.monotonic()
        results = [tm.call('calculator', {'expression': e}) for e in worst]
        elapsed = time.monotonic() - start
    time.sleep(0.2)
    stop.set()
    beating.join(5)
    assert [r.output for r in results[:3]] == ['0', '0', '1.5']
    assert all(r.error == 'bad_arguments' for r in results[3:])
    assert elapsed < 2.0, elapsed
    assert max(gaps) < 1.0, max(gaps)


def test_without_bwrap_a_sandboxed_tool_is_refused_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('PATH', '/nonexistent')  # no bwrap on PATH
    bwrap._probe.cache_clear()
    try:
        with pytest.raises(TwinkleError, match='`bubblewrap` package.*allow_unsandboxed=True'):
            ToolManager(['python'])
        with ToolManager(['calculator']) as tm:  # not sandboxed: unaffected
            assert tm.call('calculator', {'expression': '6 * 7'}).output == '42'
        with ToolManager(['python'], allow_unsandboxed=True) as tm:
            assert tm.call('python', {'code': 'print(6 * 7)'}).output == '42\n'
    finally:
        monkeypatch.undo()
        bwrap._probe.cache_clear()


def test_malformed_grants_are_refused_when_the_tool_is_added() -> None:
    with pytest.raises(TwinkleError, match="path 'relative' must be absolute"):
        ToolManager([python_tool(paths=['relative'])], allow_unsandboxed=True)
    with pytest.raises(TwinkleError, match='network must be True or False'):
        ToolManager([python_tool(network='yes')], allow_unsandboxed=True)
    with pytest.raises(TwinkleError, match="each of paths must be 'PATH' or"):
        ToolManager([python_tool(paths=[('/tmp', 'rwx')])], allow_unsandboxed=True)


def _noop() -> str:
    """Do nothing."""
    return ''


@pytest.mark.parametrize(
    ('declaration', 'message'),
    [
        ({'network': 'yes'}, "tool '_noop': network must be True or False, got 'yes'"),
        ({'paths': '/tmp'}, "tool '_noop': paths must be a list, got '/tmp'"),
        ({'paths': ['relative']}, "tool '_noop': path 'relative' must be absolute"),
        ({'paths': [('/tmp', 'rwx')]}, "tool '_noop': each of paths must be 'PATH' or .*got \\('/tmp', 'rwx'\\)"),
        ({'paths': [('/tmp',)]}, "tool '_noop': each of paths must be 'PATH' or"),
        ({'env': ['A=B']}, "tool '_noop': env must list variable names"),
        ({'env': 'HF_TOKEN'}, "tool '_noop': env must be a list"),
    ],
)
def test_a_malformed_decorator_declaration_fails_at_decoration(declaration: dict[str, object], message: str) -> None:
    with pytest.raises(TwinkleError, match=message) as raised:
        tool(**declaration)(_noop)  # type: ignore[call-overload]
    assert isinstance(raised.value, ValueError)


def test_a_declared_path_missing_on_this_host_fails_when_the_tool_is_added(tmp_path: Path) -> None:
    missing = tool(paths=[str(tmp_path / 'missing')])(_noop)  # well-formed: whether it exists is the host's fact
    with pytest.raises(TwinkleError, match=f"tool '_noop': path '{tmp_path / 'missing'}' does not exist on this host"):
        ToolManager([missing], allow_unsandboxed=True)


def test_a_malformed_class_declaration_fails_where_the_class_is_defined() -> None:
    with pytest.raises(TwinkleError, match="tool 'Broken': path 'data' must be absolute"):

        class Broken(PythonTool):
            paths = ('data',)


def test_a_function_tools_declaration_survives_pickling() -> None:
    """A worker rebuilds a local function tool from its function and options: its declaration comes along."""
    cloudpickle = pytest.importorskip('cloudpickle')

    @tool(network=True, paths=['/tmp/./'], env=['HF_TOKEN'])
    def local() -> str:
        """Do nothing."""
        return ''

    copy = cloudpickle.loads(cloudpickle.dumps(local))
    assert copy is not local
    assert (copy.network, copy.paths, copy.env) == (True, (('/tmp', 'ro'),), ('HF_TOKEN',))
