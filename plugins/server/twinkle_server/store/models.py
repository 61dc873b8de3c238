"""The training runs and sampling sessions tables of the metadata store (`store.Store`): the models a session
creates, to train or to sample from."""

from __future__ import annotations

import json
import time
from typing import Any

from twinkle_server.store.rows import SamplingSessionRow, TrainingRunRow
from twinkle_server.store.tables import StoreTables, upsert

__all__ = ['ModelTables']

_RUN = 'run_id, tenant, session_id, base_model, lora_config, user_metadata, created_at, last_request_time, corrupted'
_SAMPLING = 'sampling_session_id, tenant, session_id, base_model, model_path, created_at'


class ModelTables(StoreTables):
    """Training runs (create, look up -- their own, or another tenant's with a published checkpoint --, page, count,
    touch, mark corrupted) and sampling sessions (create, look up, number a joining client)."""

    # ---- training runs -------------------------------------------------------------------------------------
    def add_training_run(
        self,
        run_id: str,
        tenant: str,
        session_id: str,
        base_model: str,
        lora_config: dict[str, Any],
        user_metadata: Any = None,
    ) -> None:
        now = time.time()
        self.meta.execute(
            upsert('training_runs', _RUN, 'run_id'),
            (run_id, tenant, session_id, base_model, json.dumps(lora_config), json.dumps(user_metadata), now, now, 0),
        )

    def training_run(self, run_id: str, tenant: str) -> TrainingRunRow | None:
        row = self.meta.one(f'SELECT {_RUN} FROM training_runs WHERE run_id = ? AND tenant = ?', (run_id, tenant))
        return _run(row) if row else None

    def training_runs(
        self, tenant: str, limit: int, offset: int, *, accessible: bool = False
    ) -> tuple[list[TrainingRunRow], int]:
        """A page of `tenant`'s training runs, newest first (`accessible`: and the runs of other tenants that
        have a published checkpoint), and how many there are in all."""
        where = 'tenant = ?'
        params: tuple[Any, ...] = (tenant,)
        if accessible:
            where = (
                'tenant = ? OR run_id IN (SELECT run_id FROM checkpoints WHERE public = 1 AND listed = 1 '
                'AND (expires_at IS NULL OR expires_at > ?))'
            )
            params = (tenant, time.time())
        rows, total = self.meta.read(
            frozenset({'training_runs', 'checkpoints'}),
            lambda s: (
                s.all(
                    f'SELECT {_RUN} FROM training_runs WHERE {where} ORDER BY created_at DESC LIMIT ? OFFSET ?',
                    (*params, limit, offset),
                ),
                s.one(f'SELECT COUNT(*) FROM training_runs WHERE {where}', params),
            ),
        )
        return [_run(r) for r in rows], int(total[0] if total else 0)

    def accessible_training_run(self, run_id: str, tenant: str) -> TrainingRunRow | None:
        """`tenant`'s run, or another tenant's run with a published checkpoint."""
        row = self.meta.one(
            f'SELECT {_RUN} FROM training_runs WHERE run_id = ? AND (tenant = ? OR run_id IN (SELECT run_id FROM '
            f'checkpoints WHERE public = 1 AND listed = 1 AND (expires_at IS NULL OR expires_at > ?)))',
            (run_id, tenant, time.time()),
        )
        return _run(row) if row else None

    def count_training_runs(self, tenant: str) -> int:
        row = self.meta.one('SELECT COUNT(*) FROM training_runs WHERE tenant = ?', (tenant,))
        return int(row[0]) if row else 0

    def touch_training_run(self, run_id: str) -> None:
        self.meta.execute(
            'UPDATE training_runs SET last_request_time = ? WHERE run_id = ?',
            (time.time(), run_id),
            key=('last_request_time', run_id),
        )

    def mark_corrupted(self, run_id: str) -> None:
        self.meta.execute('UPDATE training_runs SET corrupted = 1 WHERE run_id = ?', (run_id,))

    # ---- sampling sessions ---------------------------------------------------------------------------------
    def add_sampling_session(self, row: SamplingSessionRow) -> None:
        self.meta.execute(
            upsert('sampling_sessions', _SAMPLING, 'sampling_session_id'),
            (row.sampling_session_id, row.tenant, row.session_id, row.base_model, row.model_path, row.created_at),
        )

    def sampling_session(self, sampling_session_id: str, tenant: str) -> SamplingSessionRow | None:
        row = self.meta.one(
            f'SELECT {_SAMPLING} FROM sampling_sessions WHERE sampling_session_id = ? AND tenant = ?',
            (sampling_session_id, tenant),
        )
        return SamplingSessionRow(*row) if row else None

    def join_sampling_session(self, sampling_session_id: str, tenant: str, attempts: int = 100) -> int | None:
        """Allocate the next client number of `tenant`'s sampling session (1, 2, ...; the creating client is 0),
        unique even with several servers on one database (compare-and-set). None for an unknown session."""
        for _ in range(attempts):
            row = self.meta.one(
                'SELECT clients FROM sampling_sessions WHERE sampling_session_id = ? AND tenant = ?',
                (sampling_session_id, tenant),
            )
            if row is None:
                return None
            taken = int(row[0])
            if self.meta.execute(
                'UPDATE sampling_sessions SET clients = ? WHERE sampling_session_id = ? AND tenant = ? AND clients = ?',
                (taken + 1, sampling_session_id, tenant, taken),
            ):
                return taken + 1
        raise RuntimeError(f'could not allocate a client of sampling session {sampling_session_id!r}: too contended')


def _run(row: tuple[Any, ...]) -> TrainingRunRow:
    return TrainingRunRow(
        row[0],
        row[1],
        row[2],
        row[3],
        json.loads(row[4]),
        json.loads(row[5] or 'null'),
        float(row[6]),
        float(row[7]),
        bool(row[8]),
    )
