"""The sandbox: a tool call in a worker process is stopped at its timeout, its memory limit and its process
limit, and reported; nothing it started survives it; it sees no secret of the parent's environment; its output
is cut; calls run concurrently. The tools are defined here and reach the worker by this module's import path (or by
value, through cloudpickle, for a closure)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from twinkle_agentic.tools import PythonTool, ToolManager, tool
from twinkle_agentic.tools.bwrap import runtime_paths
from twinkle_agentic.tools.sandbox import Sandbox, SandboxLimits


@tool(timeout_s=1.0)
def hang(seconds: float = 100.0) -> str:
    """Sleeps `seconds` (past its 1 s timeout by default)."""
    time.sleep(seconds)
    return 'woke up'


@tool
def hog(gib: int = 10) -> str:
    """Allocates `gib` GiB at once."""
    return str(len(bytearray(gib << 30)))


@tool(timeout_s=30.0)
def forker(marker: str, n: int = 100) -> str:
    """Forks `n` children that exec ``sleep MARKER`` (bounded: this machine is shared)."""
    for _ in range(n):
        if os.fork() == 0:
            os.execv('/bin/sleep', ['sleep', marker])
        time.sleep(0.005)
    time.sleep(60)
    return 'forked'


@tool
def escaper(marker: str) -> str:
    """Starts processes that leave the worker's process group (a new session; an orphan of a shell) and answers."""
    subprocess.Popen(['sleep', marker], start_new_session=True)
    subprocess.run(['sh', '-c', f'setsid sleep {marker} >/dev/null 2>&1 &'], check=True)
    time.sleep(0.2)
    return 'escaped'


@tool
def environment() -> str:
    """The worker's environment and cwd."""
    return json.dumps({'env': dict(os.environ), 'cwd': os.getcwd()})


@tool
def chatty(n: int) -> str:
    """`n` characters."""
    return 'x' * n


@tool
def fails(message: str) -> str:
    """Raises."""
    raise RuntimeError(message)


def processes_with(marker: str) -> list[int]:
    """Pids whose command line holds `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_hanging_tool_is_stopped_at_its_timeout_and_the_next_call_works() -> None:
    with ToolManager([hang]) as tm:
        result = tm.call('hang', {})
        assert (result.ok, result.error) == (False, 'timeout')
        assert result.output == "Error: tool 'hang' timed out after 1.0 s"
        assert 1.0 <= result.elapsed_s < 4.0
        again = tm.call('hang', {'seconds': 0})
        assert (again.ok, again.output) == (True, 'woke up')


def test_the_manager_timeout_overrides_the_tools() -> None:
    with ToolManager(['python'], timeout_s=0.5) as tm:
        result = tm.call('python', {'code': 'import time; time.sleep(100)'})
        assert result.output == "Error: tool 'python' timed out after 0.5 s" and result.elapsed_s < 3.5


def test_a_memory_hungry_tool_is_stopped() -> None:
    with ToolManager([hog], memory_mb=512) as tm:
        result = tm.call('hog', {})
        assert (result.ok, result.error) == (False, 'memory')
        assert result.output == "Error: tool 'hog' ran out of memory (limit 512 MiB)"
        assert tm.call('hog', {'gib': 0}).output == '0'
    with ToolManager(['python'], memory_mb=512) as tm:  # a child process inherits the limit
        out = tm.call('python', {'code': 'x = bytearray(10 << 30)'}).output
        assert 'MemoryError' in out and out.endswith('[exit status 1]')


def test_a_forking_tool_is_stopped_and_nothing_survives() -> None:
    marker = f'{4000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}'
    with ToolManager([forker], max_processes=8) as tm:
        start = time.monotonic()
        result = tm.call('forker', {'marker': marker})
        assert (result.ok, result.error) == (False, 'killed'), result
        assert result.output == "Error: tool 'forker' was stopped: it started more than 8 processes"
        assert time.monotonic() - start < 10
    assert processes_with(marker) == []


def test_processes_leaving_the_process_group_do_not_survive_the_call() -> None:
    marker = f'{5000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}'
    with ToolManager([escaper]) as tm:
        result = tm.call('escaper', {'marker': marker})
        assert (result.ok, result.output) == (True, 'escaped'), result
    assert processes_with(marker) == []


def test_the_worker_sees_no_secret_and_runs_in_a_private_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv('TINKER_API_KEY', 'secret')
    with ToolManager([environment, 'python']) as tm:
        seen = json.loads(tm.call('environment', {}).output)
        assert set(seen['env']) <= {'PATH', 'HOME', 'LANG', 'TMPDIR', 'PWD'}
        assert seen['env']['HOME'] == seen['cwd'] == '/tmp'  # the sandbox's own tmpfs
        code = "import os; print(os.environ.get('TINKER_API_KEY'), sorted(os.listdir('.')))"
        # empty but for the mount points of runtime paths under /tmp (a module another test imported from there)
        bound = sorted({Path(p).parts[2] for p in runtime_paths() if Path(p).parts[1:2] == ('tmp',)})
        assert tm.call('python', {'code': code}).output == f'None {bound}\n'


def test_output_is_truncated_with_a_marker() -> None:
    with ToolManager([chatty, fails], max_output_chars=100) as tm:
        out = tm.call('chatty', {'n': 10_000}).output
        assert out == 'x' * 100 + '\n[... output truncated: 9900 of 10000 characters dropped]'
        assert tm.call('chatty', {'n': 100}).output == 'x' * 100
        failed = tm.call('fails', {'message': 'boom ' * 100})
        assert failed.error == 'exception'
        assert failed.output.startswith("Error: tool 'fails' failed: RuntimeError: boom")
        assert len(failed.output) < 200


def test_call_many_runs_concurrently() -> None:
    with ToolManager([hang], max_workers=4) as tm:
        start = time.monotonic()
        results = tm.call_many([('hang', {'seconds': 0.7})] * 4 + [('nope', '{}')])
        elapsed = time.monotonic() - start
    assert [r.output for r in results[:4]] == ['woke up'] * 4
    assert results[4].error == 'unknown_tool'
    # one after another the four sleeps alone take 2.8 s; together one sleep plus the worker starts (which a busy
    # machine slows: the bound leaves them 2.1 s)
    assert elapsed < 4 * 0.7, elapsed


def test_python_tool_returns_stdout_and_stderr() -> None:
    assert PythonTool().sandboxed and PythonTool().timeout_s == 10.0
    with ToolManager(['python']) as tm:
        assert tm.call('python', {'code': 'print(6 * 7)'}).output == '42\n'
        assert tm.call('python', {'code': "if __name__ == '__main__':\n    print('main')"}).output == 'main\n'
        out = tm.call('python', {'code': 'import sys\nprint("out")\nsys.stderr.write("err\\n")\n1/0'}).output
        assert out.startswith('out\nerr\nTraceback') and 'ZeroDivisionError' in out
        assert out.endswith('[exit status 1]')


def test_a_closure_reaches_the_worker_by_value() -> None:
    factor = 7

    @tool
    def times(x: int) -> int:
        """`x` times a captured factor."""
        return x * factor

    result = Sandbox(SandboxLimits()).run(times, {'x': 6}, timeout_s=5.0)
    assert (result.ok, result.output) == (True, '42'), result


def test_close_leaves_the_pipes_to_the_thread_that_reads_them(monkeypatch) -> None:
    """close() kills a call in flight; the calling thread must still read the worker's end of output and report
    `killed`. close() used to close the pipes too: a reader slower than close() (a busy machine) failed on a
    closed file and reported `exception`. Here the reader waits until close() has returned."""
    import threading

    sandbox = Sandbox(SandboxLimits())
    closed, real_await = threading.Event(), Sandbox._await
    monkeypatch.setattr(
        Sandbox, '_await', lambda self, proc, t, isolated: closed.wait(30) and real_await(self, proc, t, isolated)
    )
    result: list = []
    caller = threading.Thread(target=lambda: result.append(sandbox.run(hang, {'seconds': 30}, 30.0)))
    caller.start()
    deadline = time.monotonic() + 30
    while not sandbox._live and time.monotonic() < deadline:
        time.sleep(0.01)
    sandbox.close()
    closed.set()
    caller.join(30)
    assert result[0].error == 'killed', result[0].output


def test_close_kills_calls_in_flight() -> None:
    tm = ToolManager([hang], timeout_s=30)
    future = tm._pool.submit(tm.call, 'hang', {'seconds': 30})
    time.sleep(0.5)
    start = time.monotonic()
    tm.close()
    result = future.result(timeout=10)
    assert result.error == 'killed' and time.monotonic() - start < 5
    assert tm.call('hang', {'seconds': 0}).output.endswith('the tool manager is closed')
