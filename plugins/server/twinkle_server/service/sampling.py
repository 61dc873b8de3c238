"""The sampling operations of the service: sampling sessions (create one, number a client that joins it), what a
sample request addresses, queueing a sample, and cancelling a queued or running one.

`SamplingOperations` is a collaborator `Service` holds (as `sampling`) and delegates to, reaching the service through
`core_protocol.ServiceCore`. A request's target is resolved once, at the edge (`resolve_target` -> `SampleTarget`),
and passed down as it is."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

from twinkle_server.engine.model_host.base import SampleJob
from twinkle_server.errors import ApiError, bad_request, not_found, unprocessable
from twinkle_server.service.checkpoints import CheckpointOperations
from twinkle_server.service.core_protocol import ServiceCore
from twinkle_server.store import SamplingSessionRow

__all__ = ['SEQ_IDS_PER_SAMPLING_CLIENT', 'SampleTarget', 'SamplingOperations', 'sampling_target', 'session_of_target']

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


@dataclass(frozen=True)
class SampleTarget:
    """What a sample request samples from (`SamplingOperations.resolve_target`): a hosted base model and, for a
    checkpoint, its `tinker://` path and directory; the sampling session it came through and that session's
    client session (StableReinforce records belong to it)."""

    base_model: str
    model_path: str | None = None
    adapter_dir: str | None = None
    sampling_session_id: str | None = None
    session_id: str | None = None


class SamplingOperations:
    """The sampling operations over `core` (`ServiceCore`: the store, the per-request sampling caps, each base
    model's worker and the futures table to cancel a request, queueing and the session rules) and `checkpoints`
    (where a sampling session's checkpoint is looked up)."""

    def __init__(self, core: ServiceCore, checkpoints: CheckpointOperations) -> None:
        self.core, self.checkpoints = core, checkpoints

    def create_sampling_session(
        self, tenant: str, session_id: str, seq_id: int, model_path: str | None, base_model: str | None
    ) -> str:
        self.core.require_session(tenant, session_id)
        if model_path:
            _, row = self.checkpoints.checkpoint(tenant, model_path, readable=True)
            base = self.core.files.read_meta(row.directory)['base_model']
        elif base_model:
            base = base_model
        else:
            raise unprocessable('create_sampling_session needs model_path (a tinker:// checkpoint) or base_model')
        self.core.host(base)
        sid = f'{session_id}:sample:{seq_id}'
        self.core.store.add_sampling_session(SamplingSessionRow(sid, tenant, session_id, base, model_path, time.time()))
        return sid

    def resolve_target(
        self, tenant: str, sampling_session_id: str | None, model_path: str | None, base_model: str | None
    ) -> SampleTarget:
        """What a sample request addresses, resolved once at the edge: a sampling session (its base model and
        checkpoint), a checkpoint (`tenant`'s, or another tenant's published one: checked on every request, so an
        unpublished one stops serving), or a base model; 404 for ids the tenant cannot see."""
        session = None
        if sampling_session_id:
            session = self.core.store.sampling_session(sampling_session_id, tenant)
            if session is None:
                raise not_found('sampling session', sampling_session_id)
            base_model, model_path = session.base_model, session.model_path
        elif not model_path and not base_model:
            raise unprocessable('asample needs sampling_session_id, model_path or base_model')
        adapter_dir = None
        if model_path:
            _, ck = self.checkpoints.checkpoint(tenant, model_path, readable=True)
            adapter_dir = ck.directory
            base_model = base_model if session is not None else self.core.files.read_meta(ck.directory)['base_model']
        assert base_model is not None
        return SampleTarget(
            base_model, model_path, adapter_dir, sampling_session_id or None, session.session_id if session else None
        )

    def sample(
        self, tenant: str, target: SampleTarget, job: SampleJob, post: Callable[[Any], Any], seq_id: int | None = None
    ) -> str:
        """Queue a sample of `job` (its prompt and parameters; the adapter is the target's) from `target`; `seq_id`
        (the client's request number) says which client of the sampling session sent it, so that client's
        `retrieve_futures` reports it."""
        host = self.core.host(target.base_model)
        self.core.quotas.check_sample_request(tenant, job.num_samples, job.params.max_tokens)
        self.core.quotas.check_sample_scores(tenant, len(job.prompt), job.params)
        if len(job.prompt) + job.params.max_tokens > host.max_context_length:
            raise unprocessable(
                f'prompt ({len(job.prompt)} tokens) + max_tokens ({job.params.max_tokens}) exceeds '
                f'the context length {host.max_context_length} of {target.base_model!r}'
            )
        job = dataclasses.replace(job, adapter_dir=target.adapter_dir)
        client = None
        if target.sampling_session_id:
            number = (seq_id or 0) // SEQ_IDS_PER_SAMPLING_CLIENT if (seq_id or 0) >= 0 else 0
            client = sampling_target(target.sampling_session_id, number)
        return self.core.enqueue(tenant, target.base_model, sample=job, post=post, target=client)

    def join_sampling_session(self, tenant: str, sampling_session_id: str) -> int:
        """A new client number of `tenant`'s sampling session (1, 2, ...: the creating client is 0)."""
        counter = self.core.store.join_sampling_session(sampling_session_id, tenant)
        if counter is None:
            raise not_found('sampling session', sampling_session_id)
        return counter

    def cancel_future(self, tenant: str, request_id: str) -> None:
        """Cancel one of `tenant`'s sampling requests (`cancel`); a finished request is left as it is; any other
        kind of request cannot be cancelled (400)."""
        row = self.core.store.future(request_id, tenant)
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
        for worker in self.core.workers.values():
            found = worker.cancel(request_id, exc)
            if found is not None:
                break
        self.core.futures.reject(request_id, exc)
        return found
