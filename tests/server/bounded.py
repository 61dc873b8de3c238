"""Test helpers that bound what a test waits for: a call with a deadline, and a small real disk (a tmpfs)."""

from __future__ import annotations

import contextlib
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest


def within(seconds: float, fn: Callable[[], Any], what: str = 'the call') -> Any:
    """`fn()` run in a daemon thread: its value or its exception, or a test failure after `seconds` (the tinker SDK
    retries connection errors, 429s and 5xx answers for minutes: a test must not wait that out)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box['value'] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            box['error'] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        pytest.fail(f'{what} did not finish within {seconds} s (the client is retrying)')
    if 'error' in box:
        raise box['error']
    return box['value']


@contextlib.contextmanager
def small_tmpfs(parent: Path, size_mb: int) -> Iterator[Path]:
    """A `size_mb` MiB tmpfs mounted at `parent/disk` for the block (root only: the test skips elsewhere)."""
    mnt = parent / 'disk'
    mnt.mkdir()
    mount = ['mount', '-t', 'tmpfs', '-o', f'size={size_mb}m', 'tmpfs', str(mnt)]
    if subprocess.run(mount, capture_output=True).returncode:
        pytest.skip('cannot mount a tmpfs here (needs root) to fill a disk for real')
    try:
        yield mnt
    finally:
        subprocess.run(['umount', '-l', str(mnt)], check=False)
