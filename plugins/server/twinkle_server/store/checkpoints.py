"""The checkpoints and checkpoint hub pushes tables of the metadata store (`store.Store`): the rows that describe
checkpoint files (the files themselves: `checkpoint_files.py`), who may read them, when they expire, and how their
push to a hub went."""

from __future__ import annotations

import json
import time
from typing import Any

from twinkle_server.store.db.writebehind import Write
from twinkle_server.store.rows import CheckpointRow, PushRow
from twinkle_server.store.tables import StoreTables, upsert

__all__ = ['CheckpointTables']

_CKPT = (
    'run_id, checkpoint_id, tenant, kind, directory, size_bytes, created_at, user_metadata, expires_at, listed, public'
)
#: a checkpoint row that has not expired (its expiry compared with the parameter `now`)
_LIVE = '(expires_at IS NULL OR expires_at > ?)'
_PUSH = 'run_id, checkpoint_id, tenant, repo, path_in_repo, private, state, requested_at, pushed_at, error'


class CheckpointTables(StoreTables):
    """Checkpoints (record, look up -- own or published --, list, publish, expire, delete) and their hub pushes
    (record, finish, look up, fail the ones left pending)."""

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def put_checkpoint(self, row: CheckpointRow) -> None:
        """Record a (re)written checkpoint; the hub push of an earlier checkpoint under its name is dropped."""
        self.meta.write(
            Write(
                (
                    (
                        upsert('checkpoints', _CKPT, 'run_id, checkpoint_id'),
                        (
                            row.run_id,
                            row.checkpoint_id,
                            row.tenant,
                            row.kind,
                            row.directory,
                            row.size_bytes,
                            row.created_at,
                            json.dumps(row.user_metadata),
                            row.expires_at,
                            int(row.listed),
                            int(row.public),
                        ),
                    ),
                    (
                        'DELETE FROM checkpoint_pushes WHERE run_id = ? AND checkpoint_id = ?',
                        (row.run_id, row.checkpoint_id),
                    ),
                )
            )
        )

    def checkpoint(self, run_id: str, checkpoint_id: str, tenant: str) -> CheckpointRow | None:
        """`tenant`'s checkpoint, unless it has expired."""
        row = self.meta.one(
            f'SELECT {_CKPT} FROM checkpoints WHERE run_id = ? AND checkpoint_id = ? AND tenant = ? AND {_LIVE}',
            (run_id, checkpoint_id, tenant, time.time()),
        )
        return _ckpt(row) if row else None

    def checkpoint_of_any_tenant(self, run_id: str, checkpoint_id: str) -> CheckpointRow | None:
        """The checkpoint, whoever's it is, unless it has expired (the operator's view: `twinkle server export`)."""
        row = self.meta.one(
            f'SELECT {_CKPT} FROM checkpoints WHERE run_id = ? AND checkpoint_id = ? AND {_LIVE}',
            (run_id, checkpoint_id, time.time()),
        )
        return _ckpt(row) if row else None

    def readable_checkpoint(self, run_id: str, checkpoint_id: str, tenant: str) -> CheckpointRow | None:
        """A checkpoint `tenant` may read: its own, or a published one of another tenant (unless expired)."""
        row = self.meta.one(
            f'SELECT {_CKPT} FROM checkpoints WHERE run_id = ? AND checkpoint_id = ? AND (tenant = ? OR '
            f'(public = 1 AND listed = 1)) AND {_LIVE}',
            (run_id, checkpoint_id, tenant, time.time()),
        )
        return _ckpt(row) if row else None

    def checkpoints(self, tenant: str, run_id: str | None = None, *, hidden: bool = False) -> list[CheckpointRow]:
        """Listed checkpoints (newest first); `hidden=True` returns the unlisted sampling snapshots instead.
        Expired ones are left out (the sweeper deletes them soon)."""
        listed = 0 if hidden else 1
        if run_id is None:
            rows = self.meta.all(
                f'SELECT {_CKPT} FROM checkpoints WHERE tenant = ? AND listed = ? AND {_LIVE} ORDER BY created_at DESC',
                (tenant, listed, time.time()),
            )
        else:
            rows = self.meta.all(
                f'SELECT {_CKPT} FROM checkpoints WHERE tenant = ? AND run_id = ? AND listed = ? AND {_LIVE} '
                f'ORDER BY created_at DESC',
                (tenant, run_id, listed, time.time()),
            )
        return [_ckpt(r) for r in rows]

    def public_checkpoints(self, run_id: str) -> list[CheckpointRow]:
        """The published, live checkpoints of a run (what another tenant sees of it), newest first."""
        rows = self.meta.all(
            f'SELECT {_CKPT} FROM checkpoints WHERE run_id = ? AND public = 1 AND listed = 1 AND {_LIVE} '
            f'ORDER BY created_at DESC',
            (run_id, time.time()),
        )
        return [_ckpt(r) for r in rows]

    def set_checkpoint_public(self, run_id: str, checkpoint_id: str, tenant: str, public: bool) -> int:
        """Publish or unpublish `tenant`'s checkpoint; the rows changed (0: unknown, or already so)."""
        return self.meta.execute(
            f'UPDATE checkpoints SET public = ? WHERE run_id = ? AND checkpoint_id = ? AND tenant = ? AND public = ? '
            f'AND {_LIVE}',
            (int(public), run_id, checkpoint_id, tenant, int(not public), time.time()),
        )

    def set_checkpoint_expiry(self, run_id: str, checkpoint_id: str, tenant: str, expires_at: float | None) -> int:
        """Set (None: remove) the expiry of `tenant`'s live checkpoint; the rows changed."""
        return self.meta.execute(
            f'UPDATE checkpoints SET expires_at = ? WHERE run_id = ? AND checkpoint_id = ? AND tenant = ? AND {_LIVE}',
            (expires_at, run_id, checkpoint_id, tenant, time.time()),
        )

    def expired_checkpoints(self, now: float, limit: int = 1000) -> list[CheckpointRow]:
        """Checkpoints of every tenant whose expiry has passed (for the sweeper that deletes them)."""
        rows = self.meta.all(
            f'SELECT {_CKPT} FROM checkpoints WHERE expires_at IS NOT NULL AND expires_at <= ? '
            f'ORDER BY expires_at LIMIT ?',
            (now, limit),
        )
        return [_ckpt(r) for r in rows]

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> None:
        self.meta.write(
            Write(
                (
                    ('DELETE FROM checkpoints WHERE run_id = ? AND checkpoint_id = ?', (run_id, checkpoint_id)),
                    ('DELETE FROM checkpoint_pushes WHERE run_id = ? AND checkpoint_id = ?', (run_id, checkpoint_id)),
                )
            )
        )

    def delete_expired_checkpoint(self, run_id: str, checkpoint_id: str, now: float) -> bool:
        """Delete the checkpoint's row if it is still expired at `now` (it may have been re-saved or given a new
        expiry since it was listed); True when it was deleted."""
        expired = 'run_id = ? AND checkpoint_id = ? AND expires_at IS NOT NULL AND expires_at <= ?'
        key = (run_id, checkpoint_id, now)
        return (
            self.meta.write(
                Write(
                    (
                        (
                            f'DELETE FROM checkpoint_pushes WHERE run_id = ? AND checkpoint_id = ? AND EXISTS '
                            f'(SELECT 1 FROM checkpoints WHERE {expired})',
                            (run_id, checkpoint_id, *key),
                        ),
                        (f'DELETE FROM checkpoints WHERE {expired}', key),
                    )
                )
            )
            > 0
        )

    # ---- checkpoint hub pushes -----------------------------------------------------------------------------
    def put_push(self, row: PushRow) -> None:
        self.meta.execute(
            upsert('checkpoint_pushes', _PUSH, 'run_id, checkpoint_id'),
            (
                row.run_id,
                row.checkpoint_id,
                row.tenant,
                row.repo,
                row.path_in_repo,
                int(row.private),
                row.state,
                row.requested_at,
                row.pushed_at,
                row.error,
            ),
        )

    def finish_push(self, run_id: str, checkpoint_id: str, requested_at: float, error: str | None) -> bool:
        """Mark the push requested at `requested_at` pushed (`error` None) or failed. False when that push is no
        longer the checkpoint's (it was re-saved or deleted meanwhile)."""
        state, pushed_at = ('failed', None) if error else ('pushed', time.time())
        return (
            self.meta.execute(
                'UPDATE checkpoint_pushes SET state = ?, pushed_at = ?, error = ? '
                'WHERE run_id = ? AND checkpoint_id = ? AND requested_at = ?',
                (state, pushed_at, error, run_id, checkpoint_id, requested_at),
            )
            > 0
        )

    def push(self, run_id: str, checkpoint_id: str, tenant: str) -> PushRow | None:
        row = self.meta.one(
            f'SELECT {_PUSH} FROM checkpoint_pushes WHERE run_id = ? AND checkpoint_id = ? AND tenant = ?',
            (run_id, checkpoint_id, tenant),
        )
        return _push(row) if row else None

    def pushes(self, tenant: str, run_id: str | None = None) -> dict[tuple[str, str], PushRow]:
        """The pushes of `tenant`'s checkpoints (of one run), by (run_id, checkpoint_id)."""
        if run_id is None:
            rows = self.meta.all(f'SELECT {_PUSH} FROM checkpoint_pushes WHERE tenant = ?', (tenant,))
        else:
            rows = self.meta.all(
                f'SELECT {_PUSH} FROM checkpoint_pushes WHERE tenant = ? AND run_id = ?', (tenant, run_id)
            )
        return {(p.run_id, p.checkpoint_id): p for p in map(_push, rows)}

    def fail_pending_pushes(self, error: str) -> int:
        """Mark every push still pending failed (at start-up: the process that ran them is gone)."""
        return self.meta.execute(
            "UPDATE checkpoint_pushes SET state = 'failed', error = ? WHERE state = 'pending'", (error,)
        )


def _ckpt(row: tuple[Any, ...]) -> CheckpointRow:
    return CheckpointRow(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        None if row[5] is None else int(row[5]),
        float(row[6]),
        json.loads(row[7] or 'null'),
        None if row[8] is None else float(row[8]),
        bool(row[9]),
        bool(row[10]),
    )


def _push(row: tuple[Any, ...]) -> PushRow:
    return PushRow(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        bool(row[5]),
        row[6],
        float(row[7]),
        None if row[8] is None else float(row[8]),
        row[9],
    )
