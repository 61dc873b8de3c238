"""The sampling operations of the service: sampling sessions (create one, number a client that joins it), what a
sample request addresses, queueing a sample, and cancelling a queued or running one.

`SamplingOperations` is a collaborator `Service` holds (as `sampling`) and delegates to; it is given exactly what it
uses."""

from __future__ import annotations

import time
from typing import Any, Callable

from twinkle_server.checkpoints import CheckpointFiles
from twinkle_server.errors import ApiError, bad_request, not_found, unprocessable
from twinkle_server.futures import FutureTable
from twinkle_server.model_host.base import ModelHost, SampleJob
from twinkle_server.quotas import Quotas
from twinkle_server.scheduler import ModelWorker
from twinkle_server.service_checkpoints import CheckpointOperations
from twinkle_server.store import SamplingSessionRow, Store

__all__ = ['SEQ_IDS_PER_SAMPLING_CLIENT', 'SamplingOperations', 'sampling_target', 'session_of_target']

#: a sampling client numbers its requests in blocks of a billion per client (clone) of a sampling session
SEQ_IDS_PER_SAMPLING_CLIENT = 1_000_000_000


def sampling_target(sampling_session_id: str, client: int) -> str:
    """The key under which the futures of one client of a sampling session are reported (`retrieve_futures`)."""
    return f'{sampling_session_id}#{client}'


def session_of_target(target: str | None) -> str | None:
    """The session a `sampling_target` belongs to: sampling session ids are `{session_id}:sample:{seq}`."""
    if target is None or ':sample:' not in target:
        return None
    return target.rsplit(':sample:', 1)[0]


class SamplingOperations:
    """`store` / `files` / `checkpoints`: where sampling sessions are recorded and checkpoints looked up; `quotas`:
    the per-request sampling caps; `workers` / `futures`: each base model's worker and the futures table (to cancel a
    request); `host(base_model)`: the served model (404 otherwise); `enqueue(tenant, base_model, **work)`: queue work,
    returning the request's future id (`Service.enqueue`); `require_session(tenant, session_id)`: 404 / 410 unless
    it is the tenant's active session (`Service.require_session`)."""

    def __init__(
        self,
        store: Store,
        files: CheckpointFiles,
        checkpoints: CheckpointOperations,
        quotas: Quotas,
        workers: dict[str, ModelWorker],
        futures: FutureTable,
        host: Callable[[str], ModelHost],
        enqueue: Callable[..., str],
        require_session: Callable[[str, str], None],
    ) -> None:
        self.store, self.files, self.checkpoints = store, files, checkpoints
        self.quotas, self.workers, self.futures = quotas, workers, futures
        self.host, self.enqueue, self.require_session = host, enqueue, require_session

    def create_sampling_session(
        self, tenant: str, session_id: str, seq_id: int, model_path: str | None, base_model: str | None
    ) -> str:
        self.require_session(tenant, session_id)
        if model_path:
            _, row = self.checkpoints.checkpoint(tenant, model_path, readable=True)
            base = self.files.read_meta(row.directory)['base_model']
        elif base_model:
            base = base_model
        else:
            raise unprocessable('create_sampling_session needs model_path (a tinker:// checkpoint) or base_model')
        self.host(base)
        sid = f'{session_id}:sample:{seq_id}'
        self.store.add_sampling_session(SamplingSessionRow(sid, tenant, session_id, base, model_path, time.time()))
        return sid

    def sampling_target(
        self, tenant: str, sampling_session_id: str | None, model_path: str | None, base_model: str | None
    ) -> tuple[str, str | None]:
        """(base model, checkpoint path or None) a sample request addresses; 404 for ids it cannot see."""
        if sampling_session_id:
            row = self.store.sampling_session(sampling_session_id, tenant)
            if row is None:
                raise not_found('sampling session', sampling_session_id)
            return row.base_model, row.model_path
        if model_path:
            _, ck = self.checkpoints.checkpoint(tenant, model_path, readable=True)
            return self.files.read_meta(ck.directory)['base_model'], model_path
        if base_model:
            return base_model, None
        raise unprocessable('asample needs sampling_session_id, model_path or base_model')

    def sample(
        self,
        tenant: str,
        sampling_session_id: str | None,
        model_path: str | None,
        base_model: str | None,
        job: SampleJob,
        post: Callable[[Any], Any],
        seq_id: int | None = None,
    ) -> str:
        """Queue a sample; `seq_id` (the client's request number) says which client of the sampling session sent
        it, so that client's `retrieve_futures` reports it. A checkpoint is checked on every request: another
        tenant's stops serving once it is unpublished."""
        base, model_path = self.sampling_target(tenant, sampling_session_id, model_path, base_model)
        host = self.host(base)
        self.quotas.check_sample_request(tenant, job.num_samples, job.params.max_tokens)
        self.quotas.check_sample_scores(tenant, len(job.prompt), job.params)
        if len(job.prompt) + job.params.max_tokens > host.max_context_length:
            raise unprocessable(
                f'prompt ({len(job.prompt)} tokens) + max_tokens ({job.params.max_tokens}) exceeds '
                f'the context length {host.max_context_length} of {base!r}'
            )
        if model_path:
            _, ck = self.checkpoints.checkpoint(tenant, model_path, readable=True)
            job.adapter_dir = ck.directory
        target = None
        if sampling_session_id:
            client = (seq_id or 0) // SEQ_IDS_PER_SAMPLING_CLIENT if (seq_id or 0) >= 0 else 0
            target = sampling_target(sampling_session_id, client)
        return self.enqueue(tenant, base, sample=job, post=post, target=target)

    def join_sampling_session(self, tenant: str, sampling_session_id: str) -> int:
        """A new client number of `tenant`'s sampling session (1, 2, ...: the creating client is 0)."""
        counter = self.store.join_sampling_session(sampling_session_id, tenant)
        if counter is None:
            raise not_found('sampling session', sampling_session_id)
        return counter

    def cancel_future(self, tenant: str, request_id: str) -> None:
        """Cancel one of `tenant`'s sampling requests (`cancel`); a finished request is left as it is; any other
        kind of request cannot be cancelled (400)."""
        row = self.store.future(request_id, tenant)
        if row is None:
            raise not_found('request', request_id)
        if row.state != 'pending':
            return
        if row.target is None:
            raise bad_request(f'request {request_id!r} is not a sampling request; only sampling can be cancelled')
        self.cancel(request_id, 'by the client (cancel_future)')

    def cancel(self, request_id: str, why: str) -> str | None:
        """Cancel a pending sampling request: queued, it is dropped before it runs; running, its future answers the
        cancellation at once, its rows stop at the sampler's next decode step where the sampler declares
        `stops_rows` (else they finish with the batch) and what was sampled is discarded. Either way the future
        fails with a `category: user` error saying it was cancelled `why`. Returns ``'queued'`` or ``'running'``
        (how it was found; `ModelWorker.stats` counts both), or None when its worker no longer holds it."""
        exc = ApiError(499, f'request {request_id} was cancelled {why}', category='user')
        found = None
        for worker in self.workers.values():
            found = worker.cancel(request_id, exc)
            if found is not None:
                break
        self.futures.reject(request_id, exc)
        return found
