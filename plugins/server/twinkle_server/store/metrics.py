"""The per-step metrics table of the metadata store (`store.Store`): what each training step of a run reported
(its `forward_backward` loss and metrics, its `optim_step` metrics), kept as long as the run's row; the console
draws its curves from it."""

from __future__ import annotations

import json
import time
from typing import Any

from twinkle_server.store.tables import StoreTables, upsert

__all__ = ['RunMetricTables']

MAX_POINTS = 20_000  # per run and operation: the console never draws more


class RunMetricTables(StoreTables):
    """Per-step metrics: record one step's, read a run's series, the last step of several runs."""

    def add_run_metrics(self, run_id: str, tenant: str, op: str, step: int, metrics: dict[str, float]) -> None:
        """Record the metrics `op` (``forward_backward`` or ``optim_step``) reported at `step` of `tenant`'s run."""
        self.meta.execute(
            upsert('run_metrics', 'run_id, op, step, tenant, created_at, metrics', 'run_id, op, step'),
            (run_id, op, step, tenant, time.time(), json.dumps(metrics)),
        )

    def run_metrics(
        self, run_id: str, tenant: str, limit: int = MAX_POINTS
    ) -> list[tuple[str, int, float, dict[str, Any]]]:
        """(op, step, recorded at, metrics) of `tenant`'s run, oldest step first: the newest `limit` rows; empty
        for another tenant's run."""
        rows = self.meta.all(
            'SELECT op, step, created_at, metrics FROM run_metrics WHERE run_id = ? AND tenant = ? '
            'ORDER BY step DESC, op DESC LIMIT ?',
            (run_id, tenant, limit),
        )
        return [(r[0], int(r[1]), float(r[2]), json.loads(r[3])) for r in reversed(rows)]

    def last_steps(self, tenant: str) -> dict[str, int]:
        """run id -> its highest recorded step, for every run of `tenant` that has one."""
        rows = self.meta.all('SELECT run_id, MAX(step) FROM run_metrics WHERE tenant = ? GROUP BY run_id', (tenant,))
        return {r[0]: int(r[1]) for r in rows}
