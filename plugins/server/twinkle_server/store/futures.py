"""The futures table of the metadata store (`store.Store`): the requests a server accepted, their results, and
which of them a sampling client's `retrieve_futures` has been told about."""

from __future__ import annotations

import time
from typing import Iterator

from twinkle_server.store.rows import FutureRow, RequestRow
from twinkle_server.store.tables import StoreTables, upsert

__all__ = ['FutureTables']


class FutureTables(StoreTables):
    """Futures: create (pending), finish, look up, report to `retrieve_futures`, list as a session's trace, recover
    the pending ones at start-up, prune the old finished ones."""

    def add_future(
        self,
        request_id: str,
        tenant: str,
        target: str | None = None,
        *,
        session_id: str | None = None,
        op: str | None = None,
        model_id: str | None = None,
    ) -> None:
        """A pending future; `target`: the sampling session (and client) whose `retrieve_futures` reports it;
        `session_id`, `op`, `model_id`: the session it belongs to, what it does and for which model (its trace)."""
        self.meta.execute(
            upsert(
                'futures',
                'request_id, tenant, state, content_type, body, created_at, finished_at, owner, target, delivered, '
                'session_id, op, model_id',
                'request_id',
            ),
            (
                request_id,
                tenant,
                'pending',
                None,
                None,
                time.time(),
                None,
                self.owner,
                target,
                None,
                session_id,
                op,
                model_id,
            ),
        )

    def session_requests(self, session_id: str, tenant: str, limit: int) -> tuple[list[RequestRow], int]:
        """The newest `limit` futures of `tenant`'s session (newest first; the error body of failed ones only),
        and how many it has in all. Finished futures are pruned a day after they finish."""
        rows, total = self.meta.read(
            frozenset({'futures'}),
            lambda s: (
                s.all(
                    'SELECT request_id, op, model_id, target, state, created_at, finished_at, CASE WHEN state = '
                    "'failed' THEN body END FROM futures WHERE session_id = ? AND tenant = ? "
                    'ORDER BY created_at DESC, request_id DESC LIMIT ?',
                    (session_id, tenant, limit),
                ),
                s.one('SELECT COUNT(*) FROM futures WHERE session_id = ? AND tenant = ?', (session_id, tenant)),
            ),
        )
        out = [
            RequestRow(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                float(r[5]),
                None if r[6] is None else float(r[6]),
                None if r[7] is None else bytes(r[7]),
            )
            for r in rows
        ]
        return out, int(total[0]) if total else 0

    def finish_future(
        self, request_id: str, state: str, content_type: str, body: bytes, *, untarget: bool = False
    ) -> None:
        """Record a future's result; `untarget`: it is no longer reported to `retrieve_futures` (the client never
        learnt its id, e.g. a sample refused with 429)."""
        extra = ', target = NULL' if untarget else ''
        self.meta.execute(
            f'UPDATE futures SET state = ?, content_type = ?, body = ?, finished_at = ?{extra} WHERE request_id = ?',
            (state, content_type, body, time.time(), request_id),
        )

    def future(self, request_id: str, tenant: str) -> FutureRow | None:
        row = self.meta.one(
            'SELECT request_id, tenant, state, content_type, body, target FROM futures '
            'WHERE request_id = ? AND tenant = ?',
            (request_id, tenant),
        )
        if row is None:
            return None
        return FutureRow(row[0], row[1], row[2], row[3], bytes(row[4]) if row[4] is not None else None, row[5])

    def deliver_completions(
        self, tenant: str, target: str, prev_cursor: int
    ) -> tuple[list[tuple[str, str, int | None]], int]:
        """The finished futures of `tenant`'s `target` a `retrieve_futures` poll with `prev_cursor` has not seen
        acknowledged, as (request_id, state, payload bytes), and the cursor to answer with.

        Each finished future is stamped with the cursor of the answer that first reports it; a poll acknowledges
        every answer up to its `prev_cursor`, so a future is reported again only when the answer that carried it
        was lost (the client polls again with the older cursor). Cursors grow per target."""
        rows = self.meta.all(
            'SELECT request_id, state, LENGTH(body), delivered FROM futures WHERE target = ? AND tenant = ? '
            "AND state != 'pending' AND (delivered IS NULL OR delivered > ?) ORDER BY finished_at, request_id",
            (target, tenant, prev_cursor),
        )
        if not rows:
            return [], prev_cursor
        top = self.meta.one('SELECT MAX(delivered) FROM futures WHERE target = ? AND tenant = ?', (target, tenant))
        cursor = max(prev_cursor, int(top[0]) if top and top[0] is not None else 0) + 1
        new = [r[0] for r in rows if r[3] is None]
        for start in range(0, len(new), 500):
            chunk = new[start : start + 500]
            self.meta.execute(
                f'UPDATE futures SET delivered = ? WHERE target = ? AND tenant = ? AND delivered IS NULL '
                f'AND request_id IN ({", ".join("?" * len(chunk))})',
                (cursor, target, tenant, *chunk),
            )
        return [(r[0], r[1], None if r[2] is None else int(r[2])) for r in rows], cursor

    def pending_futures(self) -> Iterator[str]:
        """Ids of unfinished futures: this server's and unowned ones (with an `owner`), else all."""
        if self.owner is None:
            rows = self.meta.all("SELECT request_id FROM futures WHERE state = 'pending'")
        else:
            rows = self.meta.all(
                "SELECT request_id FROM futures WHERE state = 'pending' AND (owner IS NULL OR owner = ?)", (self.owner,)
            )
        return iter([r[0] for r in rows])

    def pending_requests(self, tenant: str, limit: int) -> list[tuple[str, str | None, str | None, float]]:
        """`tenant`'s unfinished requests, oldest first: (request_id, op, model_id, created_at)."""
        rows = self.meta.all(
            "SELECT request_id, op, model_id, created_at FROM futures WHERE tenant = ? AND state = 'pending' "
            'ORDER BY created_at, request_id LIMIT ?',
            (tenant, limit),
        )
        return [(r[0], r[1], r[2], float(r[3])) for r in rows]

    def recent_failures(self, limit: int) -> list[tuple[str, str, str | None, str | None, float, bytes | None]]:
        """The newest `limit` failed requests of every tenant: (request_id, tenant, op, model_id, finished_at,
        error body), newest first (the console's operator view)."""
        rows = self.meta.all(
            "SELECT request_id, tenant, op, model_id, finished_at, body FROM futures WHERE state = 'failed' "
            'ORDER BY finished_at DESC, request_id LIMIT ?',
            (limit,),
        )
        return [(r[0], r[1], r[2], r[3], float(r[4] or 0.0), None if r[5] is None else bytes(r[5])) for r in rows]

    def prune_futures(self, older_than_s: float) -> int:
        """Drop finished futures older than `older_than_s` seconds (clients retrieve results within minutes)."""
        cutoff = time.time() - older_than_s
        return self.meta.execute("DELETE FROM futures WHERE state != 'pending' AND finished_at < ?", (cutoff,))
