"""Pushing saved checkpoints to ModelScope / Hugging Face repositories (`HubPushConfig`, docs/server.md).

When a hosted model's `hub_push` is enabled, every named checkpoint saved of it (Tinker `save_state` /
`save_weights_for_sampler`, native `save`; not the unnamed snapshots behind sampling sessions) is pushed after it
is written: with `per_request`, only saves that ask for it (Tinker: `user_metadata={"twinkle.hub_push": "true"}`;
native: `model.save(name, hub_push=True)`).

- Where: repo ``{namespace}/{name_prefix}{tenant}-{run_id}`` from `repo_prefix` = ``namespace`` or
  ``namespace/name_prefix`` (characters a hub refuses become "-"), default branch, the checkpoint in the
  subfolder ``weights/<name>`` or ``sampler_weights/<name>`` (its Tinker path); a re-save replaces that folder.
  Repositories are created private unless `private` is false.
- Credentials: the token is read from the environment variable the operator named (`token_env`; unset: the hub
  client's own login). Nothing a client sends is ever used as a credential or a destination.
- When: the checkpoint's files are hard-linked into a staging folder on the model's worker thread (instant, and a
  consistent snapshot even if the checkpoint is re-saved or deleted meanwhile); the upload runs on one background
  thread, never in the model's queue. A failed push is logged and recorded; it never fails the save.
- State: `Store` rows (`PushRow`) shown in checkpoint listings as `hub_push` and, for the Tinker SDK (whose
  `Checkpoint` keeps only `user_metadata`), as ``twinkle.hub_push.*`` keys of `user_metadata`. When the server
  stops, queued pushes and one still running after `STOP_WAIT_S` are recorded failed (save again to retry).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable

from twinkle_core.hub.publish import upload_folder
from twinkle_core.hub.ref import HubRef
from twinkle_server.config import HUBS, HubPushConfig
from twinkle_server.store import CheckpointRow, PushRow, Store

logger = logging.getLogger(__name__)

OPT_IN_KEY = 'twinkle.hub_push'  # a save's user_metadata key asking for a push (per_request models)
STATUS_PREFIX = 'twinkle.hub_push.'  # listing keys the server adds; a client's keys with this prefix are dropped
TRUE_VALUES = ('1', 'true', 'yes', 'on')
MAX_REPO_NAME = 96  # Hugging Face's limit (ModelScope's is larger)
STAGING = 'hub-push'  # <data_dir>/hub-push/: hard-linked snapshots waiting for their upload
STOP_WAIT_S = 30.0
MAX_ERROR_CHARS = 1000
STALE_S = 24 * 3600  # a staging folder this old belongs to a process that is gone

Uploader = Callable[..., Any]  # the signature of twinkle_core.hub.publish.upload_folder


def validate(cfg: HubPushConfig | None, where: str = 'hub_push') -> None:
    """Raise ValueError for an enabled configuration that cannot push (checked at start-up)."""
    if cfg is None or not cfg.enabled:
        return
    if cfg.hub not in HUBS:
        raise ValueError(f'{where}.hub must be one of {", ".join(HUBS)}, got {cfg.hub!r}')
    namespace = (cfg.repo_prefix or '').split('/', 1)[0]
    if not namespace or not re.fullmatch(r'[A-Za-z0-9][A-Za-z0-9._-]*', namespace):
        raise ValueError(
            f'{where}.repo_prefix must be "namespace" or "namespace/name-prefix" (a hub user or '
            f'organization), got {cfg.repo_prefix!r}'
        )


def requested(user_metadata: Mapping[str, Any] | None) -> bool:
    """Whether a save's `user_metadata` asks for a push (``twinkle.hub_push``: "true")."""
    value = user_metadata.get(OPT_IN_KEY) if isinstance(user_metadata, Mapping) else None
    return value is not None and str(value).strip().lower() in TRUE_VALUES


def client_metadata(user_metadata: dict[str, str] | None) -> dict[str, str] | None:
    """A save's `user_metadata` without the keys the server reports push state under."""
    if not isinstance(user_metadata, dict):
        return user_metadata
    return {k: v for k, v in user_metadata.items() if not str(k).startswith(STATUS_PREFIX)}


def repo_for(cfg: HubPushConfig, tenant: str, run_id: str) -> HubRef:
    """The repository a run's checkpoints go to (module docstring)."""
    namespace, _, name_prefix = (cfg.repo_prefix or '').partition('/')
    name = re.sub(r'[^A-Za-z0-9._-]+', '-', f'{name_prefix}{tenant}-{run_id}')
    name = re.sub(r'\.{2,}', '.', re.sub(r'-{2,}', '-', name)).strip('-.')
    if len(name) > MAX_REPO_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f'{name[: MAX_REPO_NAME - 9].rstrip("-.")}-{digest}'
    return HubRef(cfg.hub, namespace, name)


def listing_fields(push: PushRow) -> dict[str, Any]:
    """A push as shown in checkpoint listings (the `hub_push` object)."""
    out: dict[str, Any] = {
        'state': push.state,
        'repo': push.repo,
        'path_in_repo': push.path_in_repo,
        'private': push.private,
        'requested_at': _iso(push.requested_at),
    }
    if push.pushed_at is not None:
        out['pushed_at'] = _iso(push.pushed_at)
    if push.error:
        out['error'] = push.error
    return out


def listing_metadata(push: PushRow) -> dict[str, str]:
    """The same as ``twinkle.hub_push.*`` string entries of `user_metadata` (what the Tinker SDK keeps)."""
    return {
        f'{STATUS_PREFIX}{k}': (str(v).lower() if isinstance(v, bool) else str(v))
        for k, v in listing_fields(push).items()
    }


class HubPusher:
    """Decides which saves are pushed, and pushes them on one background thread."""

    def __init__(
        self,
        store: Store,
        data_dir: str | Path,
        configs: Mapping[str, HubPushConfig | None],
        uploader: Uploader = upload_folder,
    ) -> None:
        """`configs`: each hosted base model's effective push settings (None: not configured)."""
        for model, cfg in configs.items():
            validate(cfg, f'model {model!r} hub_push')
        self.store = store
        self.configs = dict(configs)
        self.uploader = uploader
        _remove_stale(Path(data_dir) / STAGING)
        # this process's own folder: servers sharing a data dir (PostgreSQL fronts) never touch each other's
        self.staging = Path(data_dir) / STAGING / uuid.uuid4().hex
        self._pool: ThreadPoolExecutor | None = None
        self._running: dict[Future[None], PushRow] = {}
        self._lock = threading.Lock()

    def wanted(
        self, base_model: str, user_metadata: Mapping[str, Any] | None, asked: bool = False, listed: bool = True
    ) -> HubPushConfig | None:
        """The settings a save of `base_model` is pushed with, or None when it is not pushed. `asked`: the
        request opted in another way than `user_metadata` (the native `hub_push=True`)."""
        cfg = self.configs.get(base_model)
        if cfg is None or not cfg.enabled or not listed:
            return None
        if cfg.per_request and not (asked or requested(user_metadata)):
            return None
        return cfg

    def submit(self, row: CheckpointRow, cfg: HubPushConfig) -> PushRow:
        """Record a pending push of the just-written checkpoint `row` and queue its upload. Called on the
        model's worker thread right after the write: only hard-links files here. Never raises."""
        push = PushRow(
            row.run_id, row.checkpoint_id, row.tenant, '', row.checkpoint_id, cfg.private, 'pending', time.time()
        )
        staged = None
        try:
            ref = repo_for(cfg, row.tenant, row.run_id)
            push = PushRow(
                row.run_id,
                row.checkpoint_id,
                row.tenant,
                ref.repo_url,
                row.checkpoint_id,
                cfg.private,
                'pending',
                push.requested_at,
            )
            staged = self._stage(Path(row.directory))
            self.store.put_push(push)
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix='twinkle-hub-push')
                future = self._pool.submit(self._push, push, ref, cfg, staged)
                self._running[future] = push
            future.add_done_callback(self._done)
        except Exception as exc:  # noqa: BLE001 - a push never fails the save
            logger.exception('queueing the hub push of %s/%s failed', row.run_id, row.checkpoint_id)
            self._record(push, _describe(exc), put=True)
            if staged is not None:
                shutil.rmtree(staged, ignore_errors=True)
        return push

    def close(self, wait_s: float = STOP_WAIT_S) -> None:
        """Stop: queued pushes are cancelled, a running one gets `wait_s`; what did not finish is recorded failed."""
        with self._lock:
            pool, self._pool = self._pool, None
            running = dict(self._running)
        if pool is None:
            return
        pool.shutdown(wait=False, cancel_futures=True)
        wait(list(running), timeout=wait_s)
        for future, push in running.items():
            if not future.done() or future.cancelled():
                self._record(push, 'the server stopped before this push finished; save the checkpoint again')
        if all(f.done() for f in running):
            shutil.rmtree(self.staging, ignore_errors=True)

    # ---- background thread ---------------------------------------------------------------------------------
    def _push(self, push: PushRow, ref: HubRef, cfg: HubPushConfig, staged: Path) -> None:
        error = None
        try:
            token = os.environ.get(cfg.token_env) if cfg.token_env else None
            if cfg.token_env and not token:
                raise RuntimeError(f'the environment variable {cfg.token_env} (hub_push.token_env) is not set')
            self.uploader(
                staged,
                ref,
                message=f'twinkle server: {push.checkpoint_id} of {push.run_id}',
                path_in_repo=push.path_in_repo,
                private=cfg.private,
                token=token,
            )
            logger.info('pushed %s/%s to %s', push.run_id, push.checkpoint_id, push.repo)
        except Exception as exc:  # noqa: BLE001 - recorded, never raised into the server
            error = _describe(exc)
            logger.warning('hub push of %s/%s to %s failed: %s', push.run_id, push.checkpoint_id, push.repo, exc)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        self._record(push, error)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._running.pop(future, None)

    def _record(self, push: PushRow, error: str | None, put: bool = False) -> None:
        """Store how `push` ended (`error` None: pushed); never raises."""
        try:
            if put:
                self.store.put_push(dataclasses.replace(push, state='failed', error=error))
            else:
                self.store.finish_push(push.run_id, push.checkpoint_id, push.requested_at, error)
        except Exception:  # noqa: BLE001
            logger.exception('recording the hub push state of %s/%s failed', push.run_id, push.checkpoint_id)

    def _stage(self, directory: Path) -> Path:
        """A snapshot of `directory` under the staging folder: hard links (a copy across file systems)."""
        staged = self.staging / uuid.uuid4().hex
        staged.mkdir(parents=True)
        os.utime(self.staging)  # the process's folder stays fresh while it pushes
        try:
            for src in directory.rglob('*'):
                dest = staged / src.relative_to(directory)
                if src.is_dir():
                    dest.mkdir(parents=True, exist_ok=True)
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(src, dest)
                except OSError:
                    shutil.copy2(src, dest)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        return staged


def _remove_stale(staging: Path) -> None:
    """Remove staging folders older than `STALE_S` (left by a process that was killed mid-push)."""
    if not staging.is_dir():
        return
    cutoff = time.time() - STALE_S
    for folder in staging.iterdir():
        try:
            if folder.stat().st_mtime < cutoff:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass


def _describe(exc: BaseException) -> str:
    """An error as recorded for clients: type and message, at most `MAX_ERROR_CHARS` characters."""
    text = f'{type(exc).__name__}: {exc}'
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + '...'


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat()
