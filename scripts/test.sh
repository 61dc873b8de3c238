#!/usr/bin/env bash
# Set up .venv (if needed) and run the test-suite: the fast default run, then the `slow` tests when
# TWINKLE_TEST_SLOW=1 (CI sets it), each with its 30 slowest tests listed and every test's durations written to
# test-artifacts/durations-{fast,slow}.json against the time budget (tests/time_budget.py; it fails the run with
# TWINKLE_TEST_BUDGET=enforce). They run on pytest-xdist workers, a test file at a time (a file's module fixtures, a
# server or an engine, are built once): TWINKLE_TEST_WORKERS of them for the fast run (default 2) and
# TWINKLE_SLOW_TEST_WORKERS for the slow one (default 3: its tests wait more, on subprocesses, Ray and engines);
# 0 runs in this process. Extra arguments go to the fast run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_system.sh
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# one thread per process: the workers and their tests' subprocesses share the cores, spinning intra-op threads
# would only fight over them
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# a test file at a time, longest first (tests/file_order.py: xdist's own reordering by test count is switched off)
workers=(--dist loadfile --no-loadscope-reorder)
TWINKLE_TEST_SUITE=fast .venv/bin/python -m pytest -q --durations=30 -n "${TWINKLE_TEST_WORKERS:-2}" "${workers[@]}" "$@"
if [ "${TWINKLE_TEST_SLOW:-0}" = "1" ]; then
  echo "[test] slow tests"
  set +e
  # the slow suite's budget is reported, not enforced: run three to a 2-core machine, its longest end-to-end tests
  # take over twice their budget (docs/contributing.md, "Time budget")
  TWINKLE_TEST_SUITE=slow TWINKLE_TEST_BUDGET=report .venv/bin/python -m pytest -q --durations=30 -n "${TWINKLE_SLOW_TEST_WORKERS:-3}" "${workers[@]}" \
    -m slow
  rc=$?
  set -e
  # exit code 5 = no tests collected, which is fine for an optional step
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
fi
