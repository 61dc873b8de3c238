"""The suite's time budget (tests/time_budget.py): which tests it reports, which it fails in CI."""

from __future__ import annotations

import pytest

from tests.time_budget import (
    ENFORCE_FACTOR,
    LEARNING_BUDGET_S,
    LEARNING_TOTAL_BUDGET_S,
    TEST_BUDGET_S,
    TimeBudget,
    Timing,
)


def budget_with(**calls: tuple[bool, float]) -> TimeBudget:
    budget = TimeBudget('unit', enforce=True)
    for nodeid, (learning, seconds) in calls.items():
        budget.timings[nodeid] = Timing(learning, {'setup': 0.1, 'call': seconds, 'teardown': 0.0})
    return budget


def test_a_plain_test_over_its_budget_is_reported_and_a_learning_test_has_more():
    budget = budget_with(
        plain_ok=(False, TEST_BUDGET_S - 1),
        plain_over=(False, TEST_BUDGET_S + 1),
        learning_ok=(True, LEARNING_BUDGET_S - 1),
    )
    assert [what for what, _, _ in budget.over_budget()] == ['plain_over']


def test_learning_tests_are_also_bounded_together():
    n = int(LEARNING_TOTAL_BUDGET_S // LEARNING_BUDGET_S) + 1
    budget = budget_with(**{f'learn{i}': (True, LEARNING_BUDGET_S - 1) for i in range(n)})
    ((what, seconds, limit),) = budget.over_budget()
    assert what == 'all learning tests together' and limit == LEARNING_TOTAL_BUDGET_S
    assert seconds == pytest.approx(n * (LEARNING_BUDGET_S - 1))


def test_set_up_time_is_not_charged_to_the_test_but_listed():
    budget = budget_with(first_user=(False, 1.0))
    budget.timings['first_user'].phases['setup'] = TEST_BUDGET_S + 5
    assert budget.over_budget() == [] and budget.slow_setups() == [('first_user', TEST_BUDGET_S + 5)]


class FakeSession:
    exitstatus = 0


@pytest.mark.parametrize(
    ('seconds', 'fails'), [(ENFORCE_FACTOR * TEST_BUDGET_S - 1, False), (ENFORCE_FACTOR * TEST_BUDGET_S + 1, True)]
)
def test_enforcement_fails_a_green_run_only_past_the_factor(seconds, fails):
    budget = budget_with(t=(False, seconds))
    session = FakeSession()
    budget.pytest_sessionfinish(session, 0)  # only .exitstatus is used
    assert (session.exitstatus != 0) is fails
