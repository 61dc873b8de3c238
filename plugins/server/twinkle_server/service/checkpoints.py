"""The checkpoint operations of the service: look a checkpoint up, write one (queued on its model, then recorded,
then pushed to the hub when asked), snapshot for a new sampling session, delete one; publish / unpublish, expiry
(`ttl_seconds`, and the sweep that deletes expired checkpoints), copies that share the source's bytes, and signed
download URLs for external-weights checkpoints.

Who may read a checkpoint: its owner, and -- once it is published -- every tenant (load it, sample from it, copy
it, download it). Only its owner may publish, unpublish, expire or delete it; for anyone else it answers 404.

`CheckpointOperations` is a collaborator `Service` holds and delegates to; it is given exactly what it uses."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote, urlencode

from twinkle_server.engine.model_host.base import ModelHost
from twinkle_server.errors import ApiError, bad_request, not_found, out_of_disk
from twinkle_server.service.core_protocol import ServiceCore
from twinkle_server.service.hub_push import client_metadata
from twinkle_server.store import CheckpointRow, SamplingSessionRow
from twinkle_server.store.checkpoint_files import CheckpointPath, parse_path, validate_name

__all__ = ['CheckpointOperations', 'MAX_TTL_S', 'URL_LIFETIME_S']
logger = logging.getLogger(__name__)

#: the longest `ttl_seconds` (the hosted service's bound: 10 years)
MAX_TTL_S = 10 * 365 * 24 * 3600
#: how long a signed download URL stays valid
URL_LIFETIME_S = 3600
#: the route that serves signed downloads (`tinker/routes_checkpoints.py`)
DOWNLOAD_PATH = '/api/v1/checkpoint_files'


class CheckpointOperations:
    """The checkpoint operations over `core` (`ServiceCore`: the store and checkpoint files, hub pushes, the tenants'
    live models, queueing). `min_ttl_s`: the shortest `ttl_seconds` accepted (the hosted service's: one hour)."""

    def __init__(self, core: ServiceCore, min_ttl_s: float = 3600) -> None:
        self.core = core
        self.min_ttl_s = min_ttl_s
        self._secret: bytes | None = None

    def checkpoint(self, tenant: str, path: str, *, readable: bool = False) -> tuple[CheckpointPath, CheckpointRow]:
        """`tenant`'s checkpoint at `path` (404 otherwise); `readable`: or another tenant's published one."""
        cp = parse_path(path)
        if readable:
            row = self.core.store.readable_checkpoint(cp.run_id, cp.checkpoint_id, tenant)
        else:
            row = self.core.store.checkpoint(cp.run_id, cp.checkpoint_id, tenant)
        if row is None:
            raise not_found('checkpoint', path)
        return cp, row

    def check_ttl(self, ttl_seconds: int | None) -> int | None:
        """`ttl_seconds` when it is None or within [min_ttl_s, 10 years]; else a 400 naming the range."""
        if ttl_seconds is None:
            return None
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int):
            raise bad_request(f'ttl_seconds must be an integer number of seconds or null, got {ttl_seconds!r}')
        if not self.min_ttl_s <= ttl_seconds <= MAX_TTL_S:
            raise bad_request(
                f'ttl_seconds={ttl_seconds} is out of range: between {self.min_ttl_s:g} and {MAX_TTL_S} '
                f'(10 years), or null for no expiry'
            )
        return ttl_seconds

    def save(
        self,
        tenant: str,
        model_id: str,
        seq_id: int | None,
        name: str | None,
        *,
        sampler: bool,
        optimizer: bool = True,
        overwrite: bool = True,
        user_metadata: Any = None,
        post: Callable[[str], Any] | None = None,
        scheme: str = 'tinker://',
        listed: bool = True,
        hub_push: bool = False,
        ttl_seconds: int | None = None,
        external: bool = False,
    ) -> str:
        """Queue a checkpoint write; the future's value is `post(uri)` (default `{'path': uri}`). Once written it
        is pushed to the hub when its model's `hub_push` says so (`hub_push`: the request opted in). Refused
        507 (retryable) while the disk is full; one that runs out of space while writing fails its future 507.
        `ttl_seconds`: it expires that long after it is written (`check_ttl`); `external`: an
        `external_weights/` export (the PEFT adapter files, downloaded through signed URLs)."""
        m = self.core.model(tenant, model_id)
        ttl = self.check_ttl(ttl_seconds)
        push = self.core.pusher.wanted(m.base_model, user_metadata, hub_push, listed)
        user_metadata = client_metadata(user_metadata)
        segment = 'external_weights' if external else 'sampler_weights' if sampler else 'weights'
        cp = CheckpointPath(model_id, segment, validate_name(name or ''), scheme)
        if self.core.files.free_bytes() == 0:  # after the checks of the request: bad input is still a 4xx
            raise out_of_disk('saving a checkpoint needs disk space and none is left')
        final = self.core.files.directory(tenant, cp)
        with_optimizer = bool(optimizer and not sampler and not external)
        meta: dict[str, Any] = {
            'base_model': m.base_model,
            'lora': m.lora.as_dict(),
            'tinker_lora': m.tinker_lora,
            'run_id': model_id,
            'kind': cp.kind,
            'optimizer': with_optimizer,
        }

        def write(host: ModelHost) -> Any:
            size = self.core.files.write(
                final, lambda d: host.save_state(model_id, d, optimizer=with_optimizer), meta, overwrite=overwrite
            )
            host.checkpoint_written(model_id, str(final), optimizer=with_optimizer)
            now = time.time()
            expires_at = None if ttl is None else now + ttl
            row = CheckpointRow(
                model_id, cp.checkpoint_id, tenant, cp.kind, str(final), size, now, user_metadata, expires_at, listed
            )
            self.core.store.put_checkpoint(row)
            if push is not None:
                self.core.pusher.submit(row, push)
            return post(cp.uri()) if post else {'path': cp.uri(), 'type': 'save_weights'}

        return self.core.enqueue(tenant, m.base_model, call=write, model_id=model_id, seq_id=seq_id, op='save_state')

    def save_for_new_sampler(
        self, tenant: str, model_id: str, seq_id: int | None, session_id: str, sampling_session_seq_id: int
    ) -> str:
        """The unnamed save_weights_for_sampler: snapshot the adapter (unlisted; deleted with the session) and
        create the sampling session here."""
        m = self.core.model(tenant, model_id)
        sid = f'{session_id}:sample:{sampling_session_seq_id}'
        name = f'snapshot-{sampling_session_seq_id}'

        def created(uri: str) -> dict[str, Any]:
            self.core.store.add_sampling_session(
                SamplingSessionRow(sid, tenant, session_id, m.base_model, uri, time.time())
            )
            return {'sampling_session_id': sid, 'type': 'save_weights_for_sampler'}

        return self.save(tenant, model_id, seq_id, name, sampler=True, optimizer=False, post=created, listed=False)

    def delete_checkpoint(self, tenant: str, run_id: str, checkpoint_id: str) -> None:
        row = self.core.store.checkpoint(run_id, checkpoint_id, tenant)
        if row is None:
            raise not_found('checkpoint', f'{run_id}/{checkpoint_id}')
        self.core.store.delete_checkpoint(run_id, checkpoint_id)
        self.core.files.delete(row.directory)

    # ---- publishing and expiry ---------------------------------------------------------------------------------
    def owned(self, tenant: str, run_id: str, checkpoint_id: str) -> CheckpointRow:
        """`tenant`'s listed, live checkpoint `run_id`/`checkpoint_id`; 404 for anyone else's (published or not)."""
        row = self.core.store.checkpoint(run_id, checkpoint_id, tenant)
        if row is None or not row.listed:
            raise not_found('checkpoint', f'{run_id}/{checkpoint_id}')
        return row

    def set_public(self, tenant: str, run_id: str, checkpoint_id: str, public: bool) -> None:
        """Publish (every tenant may read it) or unpublish (only its owner may, from the next request on) one of
        `tenant`'s checkpoints. When it is public (private) already the hosted service answers 409, which the SDK
        retries for five minutes; this is a 400 instead (`x-should-retry: false`), so the client hears it at once."""
        row = self.owned(tenant, run_id, checkpoint_id)
        if row.public == public or not self.core.store.set_checkpoint_public(run_id, checkpoint_id, tenant, public):
            raise bad_request(f'checkpoint {run_id}/{checkpoint_id} is already {"public" if public else "private"}')

    def set_ttl(self, tenant: str, run_id: str, checkpoint_id: str, ttl_seconds: int | None) -> None:
        """Expire `tenant`'s checkpoint `ttl_seconds` from now, or never (None)."""
        self.owned(tenant, run_id, checkpoint_id)
        ttl = self.check_ttl(ttl_seconds)
        if not self.core.store.set_checkpoint_expiry(
            run_id, checkpoint_id, tenant, None if ttl is None else time.time() + ttl
        ):
            raise not_found('checkpoint', f'{run_id}/{checkpoint_id}')

    def sweep(self, now: float | None = None) -> int:
        """Delete every expired checkpoint (row, then files); returns how many. Safe to run from several servers
        sharing one database: a row is deleted only while it is still expired, and only its deleter removes the
        files."""
        now = time.time() if now is None else now
        deleted = 0
        for row in self.core.store.expired_checkpoints(now):
            if self.core.store.delete_expired_checkpoint(row.run_id, row.checkpoint_id, now):
                _remove_tree(Path(row.directory))
                deleted += 1
                logger.info('checkpoint %s/%s of %s expired: deleted', row.run_id, row.checkpoint_id, row.tenant)
        return deleted

    # ---- copies --------------------------------------------------------------------------------------------
    def copy_to_run(self, source: CheckpointRow, tenant: str, run_id: str, ttl_seconds: int | None) -> str:
        """Copy `source` (a checkpoint the caller may read) into `tenant`'s training run `run_id` under the same
        kind and name; the files are hard links (no bytes duplicated). Returns the copy's path."""
        segment, name = source.checkpoint_id.split('/', 1)
        cp = CheckpointPath(run_id, segment, name)
        meta = {**self.core.files.read_meta(source.directory), 'run_id': run_id}
        if self.core.files.free_bytes() == 0:
            raise out_of_disk('copying a checkpoint needs a little disk space and none is left')
        final = self.core.files.directory(tenant, cp)
        size = self.core.files.link_copy(source.directory, final, meta)
        now = time.time()
        self.core.store.put_checkpoint(
            CheckpointRow(
                run_id,
                cp.checkpoint_id,
                tenant,
                source.kind,
                str(final),
                size,
                now,
                source.user_metadata,
                None if ttl_seconds is None else now + ttl_seconds,
            )
        )
        return cp.uri()

    # ---- signed downloads ----------------------------------------------------------------------------------
    def _key(self) -> bytes:
        if self._secret is None:  # one secret for every server on this database: any of them serves the URLs
            self._secret = bytes.fromhex(self.core.store.setting('download_url_secret', secrets.token_hex(32)))
        return self._secret

    def _signature(self, owner: str, reader: str, run_id: str, checkpoint_id: str, file: str, expires: int) -> str:
        message = '\n'.join((owner, reader, run_id, checkpoint_id, file, str(expires))).encode()
        return hmac.new(self._key(), message, hashlib.sha256).hexdigest()

    def download_urls(
        self, reader: str, run_id: str, checkpoint_id: str, base_url: str
    ) -> tuple[dict[str, str], float]:
        """Signed URLs, one per file of an external-weights checkpoint `reader` may read (its own, or a published
        one), valid for `URL_LIFETIME_S` and fetched with a plain GET (no API key), and when they expire. A URL
        stops working early when the checkpoint is deleted or expires, and -- for another tenant's -- when it is
        unpublished."""
        row = self.core.store.readable_checkpoint(run_id, checkpoint_id, reader)
        if row is None:
            raise not_found('checkpoint', f'{run_id}/{checkpoint_id}')
        if row.kind != 'external':
            raise bad_request(
                f'{run_id}/{checkpoint_id} is a {row.kind} checkpoint; download URLs exist for external_weights/ '
                f'checkpoints only (export one with TrainingClient.save_weights_external)'
            )
        expires = int(time.time()) + URL_LIFETIME_S
        urls = {}
        for rel in self.core.files.files(row.directory):
            query = {
                'run_id': run_id,
                'checkpoint_id': checkpoint_id,
                'owner': row.tenant,
                'reader': reader,
                'expires': expires,
                'sig': self._signature(row.tenant, reader, run_id, checkpoint_id, rel, expires),
            }
            urls[rel] = f'{base_url.rstrip("/")}{DOWNLOAD_PATH}/{quote(rel)}?{urlencode(query)}'
        return urls, float(expires)

    def signed_file(
        self, file: str, run_id: str, checkpoint_id: str, owner: str, reader: str, expires: int, sig: str
    ) -> Path:
        """The file a signed URL names: 403 for a bad or expired signature, 404 once the checkpoint is gone,
        expired or (for another reader) unpublished."""
        good = self._signature(owner, reader, run_id, checkpoint_id, file, expires)
        given = sig.encode('utf-8', 'replace')  # compare_digest refuses non-ASCII text
        if not hmac.compare_digest(good.encode(), given) or expires < time.time():
            raise ApiError(
                403, 'invalid or expired download URL; ask get_external_weights_urls for new ones', category='user'
            )
        row = self.core.store.checkpoint(run_id, checkpoint_id, owner)
        if row is None or (reader != owner and not row.public):
            raise not_found('checkpoint', f'{run_id}/{checkpoint_id}')
        path = self.core.files.files(row.directory).get(file)
        if path is None:
            raise not_found('file', file)
        return path


def _remove_tree(directory: Path) -> None:
    """Delete a checkpoint directory: first moved aside (a `.old-` name the start-up cleanup also removes), so a
    listing never sees it half-deleted."""
    if not directory.exists():
        return
    trash = directory.parent / f'.old-{directory.name}-{uuid.uuid4().hex[:8]}'
    try:
        directory.rename(trash)
    except OSError:
        trash = directory
    shutil.rmtree(trash, ignore_errors=True)
