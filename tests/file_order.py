"""Longest test files first: the suites run on pytest-xdist workers a file at a time (scripts/test.sh), and a long
file started last keeps one worker busy after the others are done. Files are ordered by the seconds they took in a
recorded run of the same suite (``TWINKLE_TEST_SUITE``; ``tests/file_durations.json``), longest first; a file it
does not list yet (a new one) goes first. The tests of a file keep their order. Refresh the record from a CI run's
per-test durations (``tests/time_budget.py`` writes them):

    python -m tests.file_order fast=test-artifacts/durations-fast.json slow=test-artifacts/durations-slow.json
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().parent / 'file_durations.json'

#: Fast suite: test files that share an expensive session fixture run on ONE worker, so that it is built once (each
#: worker would build its own: a vLLM engine is ~30 s of CPU, a Ray instance ~10 s). Not in the slow suite, whose
#: Ray files are too long to serialise on one worker.
SHARED_SETUP_GROUPS: dict[str, tuple[str, ...]] = {
    'vllm-engine': (
        'tests/contract/test_sampler_contract.py',
        'tests/vllm/test_server_vllm.py',
        'tests/vllm/test_server_vllm_sampling_extras.py',
        'tests/vllm/test_vllm_sampler.py',
    ),
    'ray-instance': ('tests/ray/test_ray_runtime.py', 'tests/ray/test_ray_sampler_group.py'),
}
_GROUP_OF = {path: group for group, paths in SHARED_SETUP_GROUPS.items() for path in paths}


def file_seconds(duration_file: Path) -> dict[str, float]:
    """Seconds per test file (setup + call + teardown of its tests) in a `tests/time_budget.py` duration file."""
    seconds: dict[str, float] = defaultdict(float)
    for nodeid, phases in json.loads(duration_file.read_text()).items():
        seconds[nodeid.split('::')[0]] += sum(v for k, v in phases.items() if k != 'learning')
    return {name: round(s, 1) for name, s in sorted(seconds.items())}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    suite = os.environ.get('TWINKLE_TEST_SUITE', '')
    recorded: dict[str, float] = json.loads(RECORD.read_text()).get(suite, {}) if RECORD.exists() else {}
    if not recorded:
        return
    first_seen = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split('::')[0], i)

    def key(pair: tuple[int, pytest.Item]) -> tuple[float, int, int]:
        i, item = pair
        name = item.nodeid.split('::')[0]
        return (-recorded.get(name, float('inf')), first_seen[name], i)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """The fast suite's scheduler: a file at a time (``--dist loadfile``), the `SHARED_SETUP_GROUPS` a group at a
    time. None (the slow suite, or another ``--dist``): xdist's own."""
    if os.environ.get('TWINKLE_TEST_SUITE') != 'fast' or config.getoption('dist') != 'loadfile':
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedSetupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split('::', 1)[0]
            return _GROUP_OF.get(path, path)

    return SharedSetupScheduling(config, log)  # type: ignore[arg-type]


if __name__ == '__main__':
    suites = dict(arg.split('=', 1) for arg in sys.argv[1:])
    RECORD.write_text(json.dumps({name: file_seconds(Path(p)) for name, p in suites.items()}, indent=1) + '\n')
    print(f'wrote {RECORD}')
