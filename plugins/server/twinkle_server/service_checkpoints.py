"""The checkpoint operations of the service: look a checkpoint up, write one (queued on its model, then recorded,
then pushed to the hub when asked), snapshot for a new sampling session, delete one.

`CheckpointOperations` is a collaborator `Service` holds and delegates to; it is given exactly what it uses."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from twinkle_server.checkpoints import CheckpointFiles, CheckpointPath, parse_path, validate_name
from twinkle_server.errors import not_found, out_of_disk
from twinkle_server.hub_push import HubPusher, client_metadata
from twinkle_server.model_host.base import ModelHost
from twinkle_server.store import CheckpointRow, SamplingSessionRow, Store

if TYPE_CHECKING:
    from twinkle_server.service import LiveModel

__all__ = ['CheckpointOperations']


class CheckpointOperations:
    """`store` / `files`: where checkpoints are recorded and written; `pusher`: hub pushes after a write;
    `model(tenant, model_id)`: the tenant's live training model (404 otherwise); `enqueue(tenant, base_model,
    **work)`: queue work on a base model's worker, returning the request's future id (`Service.enqueue`)."""

    def __init__(
        self,
        store: Store,
        files: CheckpointFiles,
        pusher: HubPusher,
        model: Callable[[str, str], LiveModel],
        enqueue: Callable[..., str],
    ) -> None:
        self.store, self.files, self.pusher = store, files, pusher
        self.model, self.enqueue = model, enqueue

    def checkpoint(self, tenant: str, path: str) -> tuple[CheckpointPath, CheckpointRow]:
        cp = parse_path(path)
        row = self.store.checkpoint(cp.run_id, cp.checkpoint_id, tenant)
        if row is None:
            raise not_found('checkpoint', path)
        return cp, row

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
    ) -> str:
        """Queue a checkpoint write; the future's value is `post(uri)` (default `{'path': uri}`). Once written it
        is pushed to the hub when its model's `hub_push` says so (`hub_push`: the request opted in). Refused
        507 (retryable) while the disk is full; one that runs out of space while writing fails its future 507."""
        m = self.model(tenant, model_id)
        push = self.pusher.wanted(m.base_model, user_metadata, hub_push, listed)
        user_metadata = client_metadata(user_metadata)
        cp = CheckpointPath(model_id, 'sampler_weights' if sampler else 'weights', validate_name(name or ''), scheme)
        if self.files.free_bytes() == 0:  # after the checks of the request: bad input is still a 4xx
            raise out_of_disk('saving a checkpoint needs disk space and none is left')
        final = self.files.directory(tenant, cp)
        with_optimizer = bool(optimizer and not sampler)
        meta: dict[str, Any] = {
            'base_model': m.base_model,
            'lora': m.lora.as_dict(),
            'tinker_lora': m.tinker_lora,
            'run_id': model_id,
            'kind': cp.kind,
            'optimizer': with_optimizer,
        }

        def write(host: ModelHost) -> Any:
            size = self.files.write(
                final, lambda d: host.save_state(model_id, d, optimizer=with_optimizer), meta, overwrite=overwrite
            )
            host.checkpoint_written(model_id, str(final), optimizer=with_optimizer)
            row = CheckpointRow(
                model_id, cp.checkpoint_id, tenant, cp.kind, str(final), size, time.time(), user_metadata, None, listed
            )
            self.store.put_checkpoint(row)
            if push is not None:
                self.pusher.submit(row, push)
            return post(cp.uri()) if post else {'path': cp.uri(), 'type': 'save_weights'}

        return self.enqueue(tenant, m.base_model, call=write, model_id=model_id, seq_id=seq_id, op='save_state')

    def save_for_new_sampler(
        self, tenant: str, model_id: str, seq_id: int | None, session_id: str, sampling_session_seq_id: int
    ) -> str:
        """The unnamed save_weights_for_sampler: snapshot the adapter (unlisted; deleted with the session) and
        create the sampling session here."""
        m = self.model(tenant, model_id)
        sid = f'{session_id}:sample:{sampling_session_seq_id}'
        name = f'snapshot-{sampling_session_seq_id}'

        def created(uri: str) -> dict[str, Any]:
            self.store.add_sampling_session(SamplingSessionRow(sid, tenant, session_id, m.base_model, uri, time.time()))
            return {'sampling_session_id': sid, 'type': 'save_weights_for_sampler'}

        return self.save(tenant, model_id, seq_id, name, sampler=True, optimizer=False, post=created, listed=False)

    def delete_checkpoint(self, tenant: str, run_id: str, checkpoint_id: str) -> None:
        row = self.store.checkpoint(run_id, checkpoint_id, tenant)
        if row is None:
            raise not_found('checkpoint', f'{run_id}/{checkpoint_id}')
        self.store.delete_checkpoint(run_id, checkpoint_id)
        self.files.delete(row.directory)
