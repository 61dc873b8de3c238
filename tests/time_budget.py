"""The test suite's time budget (docs/contributing.md, "Time budget"), kept by the suite itself.

Every test's setup, call and teardown times are written to ``test-artifacts/durations-<suite>.json`` (``<suite>``
from ``TWINKLE_TEST_SUITE``, else ``run``) and the terminal summary lists the tests over their budget:

- a test marked ``learning`` (it asserts that training improves a measured value): ``LEARNING_BUDGET_S`` for its
  call, and all learning tests of a run together ``LEARNING_TOTAL_BUDGET_S``;
- any other test: ``TEST_BUDGET_S`` for its call.

Setup and teardown are not charged to a test: a shared fixture (a server, a vLLM engine) is set up by whichever test
needs it first. They are listed as "set-ups" when one takes longer than ``TEST_BUDGET_S``.

With ``TWINKLE_TEST_BUDGET=enforce`` (CI sets it for the fast suite) a test over ``ENFORCE_FACTOR`` times its
budget, or learning tests over that factor of their total, fail the run: the factor leaves room for a slower machine
of the same kind, not for a test that outgrew its budget. Under pytest-xdist the times are those of the workers,
tests running side by side.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TEST_BUDGET_S = 60.0
LEARNING_BUDGET_S = 180.0
LEARNING_TOTAL_BUDGET_S = 480.0
ENFORCE_FACTOR = 2.0
ARTIFACTS = Path(__file__).resolve().parents[1] / 'test-artifacts'


@dataclass
class Timing:
    """One test's phases, in seconds, and whether it is a learning test."""

    learning: bool
    phases: dict[str, float] = field(default_factory=dict)


class TimeBudget:
    """Collects the phases of every test and reports (or enforces) the budget at the end of the session."""

    def __init__(self, suite: str, enforce: bool) -> None:
        self.suite = suite
        self.enforce = enforce
        self.timings: dict[str, Timing] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # called in the controller for every phase, also for the reports of pytest-xdist workers
        timing = self.timings.setdefault(report.nodeid, Timing('learning' in report.keywords))
        timing.phases[report.when] = report.duration

    def over_budget(self) -> list[tuple[str, float, float]]:
        """(what, seconds, budget) for each test, or the learning tests together, over their budget."""
        over = []
        for nodeid, timing in self.timings.items():
            budget = LEARNING_BUDGET_S if timing.learning else TEST_BUDGET_S
            if timing.phases.get('call', 0.0) > budget:
                over.append((nodeid, timing.phases['call'], budget))
        learning_total = sum(t.phases.get('call', 0.0) for t in self.timings.values() if t.learning)
        if learning_total > LEARNING_TOTAL_BUDGET_S:
            over.append(('all learning tests together', learning_total, LEARNING_TOTAL_BUDGET_S))
        return over

    def slow_setups(self) -> list[tuple[str, float]]:
        return [
            (nodeid, t.phases['setup'])
            for nodeid, t in self.timings.items()
            if t.phases.get('setup', 0.0) > TEST_BUDGET_S
        ]

    def write(self) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f'durations-{self.suite}.json'
        rows = {nodeid: {'learning': t.learning, **t.phases} for nodeid, t in self.timings.items()}
        path.write_text(json.dumps(rows, indent=1, sort_keys=True))
        return path

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.timings:
            return
        path = self.write()
        write = terminalreporter.write_line
        write(f'[budget] per-test durations: {path}')
        for nodeid, seconds in self.slow_setups():
            write(f'[budget] set-up over {TEST_BUDGET_S:.0f} s (shared fixture?): {seconds:.1f} s {nodeid}')
        over = self.over_budget()
        for what, seconds, budget in over:
            hard = ' (over the enforced limit)' if seconds > ENFORCE_FACTOR * budget else ''
            write(f'[budget] over budget{hard}: {seconds:.1f} s > {budget:.0f} s: {what}')
        if not over:
            write('[budget] every test is within its budget')

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        hard = [o for o in self.over_budget() if o[1] > ENFORCE_FACTOR * o[2]]
        if self.enforce and hard and exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, 'workerinput'):  # a pytest-xdist worker: the controller collects and writes
        return
    suite = os.environ.get('TWINKLE_TEST_SUITE', 'run')
    enforce = os.environ.get('TWINKLE_TEST_BUDGET', '') == 'enforce'
    config.pluginmanager.register(TimeBudget(suite, enforce), 'twinkle-time-budget')
