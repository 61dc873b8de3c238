"""The service core shared by the Tinker routes and the native routes: tenants' live models, sampling
sessions, checkpoints and the queued operations on them. Routes translate wire formats; this module owns
the rules (ownership, limits, seq_id ordering, atomic checkpoints, persistence).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from twinkle_server import logs
from twinkle_server.auth import LoginThrottle
from twinkle_server.checkpoints import CheckpointFiles
from twinkle_server.config import ServerConfig
from twinkle_server.drain import Drain
from twinkle_server.errors import ApiError, bad_request, not_found, unprocessable
from twinkle_server.futures import FutureTable
from twinkle_server.hub_push import HubPusher
from twinkle_server.metrics import Gauges, Metrics
from twinkle_server.model_host.base import OPTIMIZERS, AdamStep, LoraSpec, ModelHost, OptimStep, SampleJob, TrainBatch
from twinkle_server.quotas import Quotas
from twinkle_server.scheduler import ModelWorker, Work
from twinkle_server.service_checkpoints import CheckpointOperations
from twinkle_server.store import SamplingSessionRow, Store
from twinkle_server.tinker.custom_loss import CustomLossStore
from twinkle_server.tinker.images import DecodeBudget, ImagePolicy
from twinkle_server.tinker.lora import lora_targets
from twinkle_server.tinker.stability import StabilityRecords

logger = logging.getLogger(__name__)
SEEN_PER_MODEL = 4096  # re-posts are retries of recent requests
#: a sampling client numbers its requests in blocks of a billion per client (clone) of a sampling session
SEQ_IDS_PER_SAMPLING_CLIENT = 1_000_000_000
IDEMPOTENCY_KEEP_S = 24 * 3600


def sampling_target(sampling_session_id: str, client: int) -> str:
    """The key under which the futures of one client of a sampling session are reported (`retrieve_futures`)."""
    return f'{sampling_session_id}#{client}'


def _session_of_target(target: str | None) -> str | None:
    """The session a `sampling_target` belongs to: sampling session ids are `{session_id}:sample:{seq}`."""
    if target is None or ':sample:' not in target:
        return None
    return target.rsplit(':sample:', 1)[0]


@dataclass
class LiveModel:
    """A training model loaded in its base model's host (its adapter is named by `model_id`)."""

    model_id: str
    tenant: str
    base_model: str
    session_id: str
    lora: LoraSpec
    tinker_lora: dict[str, Any]
    created_by: str = ''  # the request that created it: a re-posted create/load returns the same future


class Service:
    """The service core (module docstring). Checkpoint operations are delegated to `checkpoints`
    (`service_checkpoints.CheckpointOperations`); the `/metrics` gauges are handed to `metrics` (`Metrics.watch`)."""

    def __init__(
        self,
        config: ServerConfig,
        hosts: dict[str, ModelHost],
        loop: asyncio.AbstractEventLoop,
        store: Store | None = None,
    ) -> None:
        """`store`: an open metadata store (default: `Store.open(config.database_url, config.data_dir)`, keeping
        the writes a full disk refuses in memory until there is room)."""
        self.config = config
        self.store = store if store is not None else Store.open(config.database_url, config.data_dir, write_behind=True)
        self.files = CheckpointFiles(config.data_dir)
        self.pusher = HubPusher(
            self.store, config.data_dir, {name: spec.hub_push for name, spec in config.model_specs.items()}
        )
        self.futures = FutureTable(self.store, loop)
        self.futures.recover()
        self.hosts = hosts
        self.metrics = Metrics()
        self.workers = {
            name: ModelWorker(
                host,
                max_queued_samples=config.max_queued_samples,
                max_batch=config.max_batch,
                seq_gap_timeout_s=config.seq_gap_timeout_s,
                metrics=self.metrics,
            )
            for name, host in hosts.items()
        }
        self.drain = Drain(self.workers, self.futures, config.drain_timeout_s)
        self.quotas = Quotas(config, self.store)
        self.logins = LoginThrottle(config.max_failed_logins_per_minute)
        self.image_budget = DecodeBudget(config.image_decode_budget_bytes)
        #: what samples with record_stability_info recorded, for stable_reinforce provenance (tinker.stability)
        self.stability = StabilityRecords()
        #: custom losses uploaded with /create_custom_loss, per tenant and session, in memory (tinker.custom_loss)
        self.custom_losses = CustomLossStore()
        self.models: dict[str, LiveModel] = {}
        # model_id -> {seq_id: request_id} of its recent requests, so a re-posted request gets its original future
        self._seen: dict[str, OrderedDict[int, str]] = {}
        self._lock = threading.Lock()
        self.checkpoints = CheckpointOperations(
            self.store, self.files, self.pusher, self.model, self.enqueue, min_ttl_s=config.min_checkpoint_ttl_s
        )
        self._sweeper_stop = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep_loop, name='twinkle-checkpoint-sweeper', daemon=True)
        self._sweeper.start()
        self.metrics.watch(
            Gauges(
                queue_depths=lambda: {name: w.queue_depths() for name, w in self.workers.items()},
                running=lambda: {name: w.running() for name, w in self.workers.items()},
                live_adapters=self.live_adapters,
                pending_futures=self.futures.pending_total,
                draining=lambda: self.drain.draining,
            )
        )

    def close(self) -> None:
        """Shut down. Queued work is failed, the running host call may finish (briefly, after a drain), and
        whatever is still unanswered is failed too: every accepted request gets a definite answer."""
        self._sweeper_stop.set()
        self.drain.fail_queued()
        for w in self.workers.values():
            w.stop(timeout_s=1.0 if self.drain.draining else 10.0)
        self.drain.fail_running()
        for host in self.hosts.values():
            try:
                host.close()
            except Exception:  # noqa: BLE001 - closing the others and the store matters more
                logger.exception('closing the host of %s failed', host.base_model)
        self.pusher.close()
        self._sweeper.join(timeout=5.0)
        self.store.close()

    def _sweep_loop(self) -> None:
        """Delete expired checkpoints (and old idempotency records): at start-up, then every
        `checkpoint_sweep_s` seconds."""
        while True:
            try:
                self.checkpoints.sweep()
                self.store.prune_idempotent_results(IDEMPOTENCY_KEEP_S)
            except Exception:  # noqa: BLE001 - keep sweeping; the next round retries
                logger.exception('the checkpoint expiry sweep failed')
            if self._sweeper_stop.wait(self.config.checkpoint_sweep_s):
                return

    # ---- tenants -------------------------------------------------------------------------------------------
    def add_session(
        self,
        tenant: str,
        session_id: str,
        tags: list[str],
        user_metadata: Any,
        project_id: str | None = None,
        display_name: str | None = None,
    ) -> None:
        """Record a new session, within the tenant's `max_sessions` (unfinished, heart-beating) cap."""
        self.quotas.check_new_session(tenant)
        self.store.add_session(session_id, tenant, tags, user_metadata, project_id, display_name)

    def check_train_request(self, tenant: str, model_id: str, lengths: list[int]) -> None:
        """Per-request caps of a forward_backward (`lengths`: tokens per datum), checked before decoding."""
        context = self.host(self.model(tenant, model_id).base_model).max_context_length
        self.quotas.check_train_request(tenant, lengths, context)

    def image_policy(self, tenant: str) -> ImagePolicy:
        """What decoding the images of one of `tenant`'s requests may cost: its limits, this server's budget."""
        limits = self.config.limits(tenant)
        return ImagePolicy(limits.max_image_pixels, limits.max_image_bytes_per_request, self.image_budget)

    def _check_new_adapter(self, tenant: str, rank: int, base_model: str) -> None:
        self.quotas.check_new_adapter(tenant, rank, sum(1 for m in self.models.values() if m.tenant == tenant))
        host = self.host(base_model)
        hosted = sum(1 for m in self.models.values() if m.base_model == base_model)
        if host.max_adapters is not None and hosted >= host.max_adapters:
            raise ApiError(
                403,
                f'base model {base_model!r} is served by {host.backend_name}, which '
                f'trains at most {host.max_adapters} adapter(s) at once; this server hosts '
                f'{hosted} already (free one, or serve the model with a multi-adapter backend, '
                f'e.g. MultiLoraTransformersModel)',
            )

    # ---- lookups (404 for other tenants' ids) --------------------------------------------------------------
    def hosted_name(self, base_model: str) -> str:
        """The served name `base_model` means: itself, or without an ``ms://`` / ``hf://`` prefix (clients
        written for the hubs name the hub id of the model this server hosts under that name)."""
        if base_model not in self.hosts and base_model.startswith(('ms://', 'hf://')):
            return base_model.split('://', 1)[1]
        return base_model

    def host(self, base_model: str) -> ModelHost:
        logs.annotate(model=base_model)
        if base_model not in self.hosts:
            raise ApiError(404, f'base model {base_model!r} is not served here; available: {sorted(self.hosts)}')
        return self.hosts[base_model]

    def live_adapters(self) -> dict[str, int]:
        """Training models loaded now, by hosted base model (zeros included)."""
        counts = dict.fromkeys(self.hosts, 0)
        for m in list(self.models.values()):
            counts[m.base_model] = counts.get(m.base_model, 0) + 1
        return counts

    def model(self, tenant: str, model_id: str) -> LiveModel:
        m = self.models.get(model_id)
        if m is None or m.tenant != tenant:
            if m is None and self.store.training_run(model_id, tenant) is not None:
                raise ApiError(
                    404,
                    f'model {model_id!r} is not loaded (the server restarted or its session ended); '
                    f'resume it from a checkpoint with create_training_client_from_state',
                )
            raise not_found('model', model_id)
        return m

    # ---- queueing ------------------------------------------------------------------------------------------
    def enqueue(
        self,
        tenant: str,
        base_model: str,
        *,
        post: Callable[[Any], Any] = lambda r: r,
        model_id: str | None = None,
        seq_id: int | None = None,
        target: str | None = None,
        session_id: str | None = None,
        traced_model: str | None = None,
        **work: Any,
    ) -> str:
        """Queue work on `base_model`'s host and return a future id; `post(result)` (worker thread) makes the
        future's value. `target`: the sampling-session client whose `retrieve_futures` reports the future.
        `session_id` / `traced_model`: the session and model the request belongs to in its session's trace, where
        `model_id` or `target` do not say (a model's creation)."""
        logs.annotate(model=base_model)
        if model_id is not None and seq_id is not None:
            with self._lock:
                recent = self._seen.get(model_id)
                seen = recent.get(seq_id) if recent is not None else None
            if seen is not None:
                return seen
        self.quotas.check_pending(tenant, self.futures.pending(tenant))
        item = Work(
            tenant,
            on_done=lambda r: self.futures.resolve(request_id, post(r)),
            on_error=lambda e: self.futures.reject(request_id, e),
            model_id=model_id,
            seq_id=seq_id,
            **work,
        )
        live = self.models.get(model_id) if model_id is not None else None
        request_id = self.futures.create(
            tenant,
            target=target,
            session_id=session_id or (live.session_id if live else None) or _session_of_target(target),
            op=item.operation,
            model_id=traced_model or model_id,
        )
        item.request_id = request_id
        try:
            self.workers[base_model].submit(item)
        except ApiError as exc:
            self.futures.reject(request_id, exc, untarget=True)  # the client never learns this id
            raise
        if model_id is not None and seq_id is not None:
            with self._lock:
                recent = self._seen.setdefault(model_id, OrderedDict())
                recent[seq_id] = request_id
                if len(recent) > SEEN_PER_MODEL:
                    recent.popitem(last=False)
        return request_id

    def release_seq_id(self, tenant: str, model_id: str, seq_id: int) -> None:
        """A request of `tenant` with this seq_id was refused before it was queued: later ones must not wait for
        it. Ignored for another tenant's model, and for a seq_id whose work is already queued or done."""
        m = self.models.get(model_id)
        if m is not None and m.tenant == tenant:
            self.workers[m.base_model].skip(model_id, seq_id)

    # ---- training models -----------------------------------------------------------------------------------
    def create_model(
        self,
        tenant: str,
        session_id: str,
        model_seq_id: int,
        base_model: str,
        tinker_lora: dict[str, Any],
        user_metadata: Any = None,
        lora: LoraSpec | None = None,
        optimizer: str = 'adamw',
    ) -> str:
        """A new training model. `lora`: the exact adapter (native API); by default it is derived from the
        Tinker `tinker_lora` (rank, train_attn/mlp/unembed, seed) with the server's `lora_alpha` and the optimizer
        family `optimizer` (Tinker's `optimizer_config.type`: adamw or dimuon)."""
        self.require_session(tenant, session_id)
        self.host(base_model)
        rank = lora.rank if lora is not None else tinker_lora.get('rank')
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise unprocessable(f'lora_config.rank must be an integer >= 1, got {rank!r}')
        self._check_new_adapter(tenant, rank, base_model)
        if lora is None:
            lora = LoraSpec(
                rank, self.config.lora_alpha, lora_targets(tinker_lora), tinker_lora.get('seed'), optimizer=optimizer
            )
        model_id = f'{session_id}:train:{model_seq_id}'
        if model_id in self.models:
            return self._repost(tenant, model_id)
        live = LiveModel(model_id, tenant, base_model, session_id, lora, tinker_lora)

        def create(host: ModelHost) -> dict[str, Any]:
            with self._undo_on_failure(live):
                host.add_adapter(model_id, lora)
            self.store.add_training_run(model_id, tenant, session_id, base_model, _run_config(live), user_metadata)
            return {'model_id': model_id, 'type': 'create_model'}

        self.models[model_id] = live
        self.workers[base_model].start_sequence(model_id, 1)
        try:
            live.created_by = self.enqueue(
                tenant, base_model, call=create, op='create_model', session_id=session_id, traced_model=model_id
            )
        except ApiError:
            self._forget(model_id)
            raise
        return live.created_by

    def _repost(self, tenant: str, model_id: str) -> str:
        """A create/load re-posted for an existing model id (a client retry) gets the original future."""
        live = self.models[model_id]
        if live.tenant != tenant or not live.created_by:
            raise ApiError(400, f'model {model_id!r} already exists in this session (model_seq_id reused)')
        return live.created_by

    def load_new_model(
        self,
        tenant: str,
        session_id: str,
        model_seq_id: int,
        path: str,
        optimizer: bool,
        base_model: str | None = None,
        user_metadata: Any = None,
        optimizer_config: str | None = None,
    ) -> str:
        """Create a model from a checkpoint (the load is its request 0; the next expected seq_id is 1). With
        `optimizer` the checkpoint's optimizer (family and state) is restored and `optimizer_config` (a family
        name) may only repeat it; weights only, the model gets `optimizer_config` (default AdamW)."""
        self.require_session(tenant, session_id)
        cp, row = self.checkpoints.checkpoint(tenant, path, readable=True)
        meta = self.files.read_meta(row.directory)
        base = base_model or meta['base_model']
        if base != meta['base_model']:
            raise unprocessable(f'checkpoint {path} was trained on {meta["base_model"]!r}, not {base!r}')
        if optimizer and cp.kind != 'training':
            raise unprocessable(f'{path} is a sampler checkpoint without optimizer state; load a weights/ checkpoint')
        self.host(base)
        lora = LoraSpec.from_dict(meta['lora'])
        if optimizer and optimizer_config not in (None, lora.optimizer):
            raise unprocessable(
                f'checkpoint {path} holds {lora.optimizer} optimizer state; optimizer_config '
                f'{optimizer_config!r} cannot override it (load weights only to change optimizer)'
            )
        if not optimizer:
            lora = dataclasses.replace(lora, optimizer=optimizer_config or 'adamw')
        self._check_new_adapter(tenant, lora.rank, base)
        model_id = f'{session_id}:train:{model_seq_id}'
        if model_id in self.models:
            return self._repost(tenant, model_id)
        live = LiveModel(model_id, tenant, base, session_id, lora, meta.get('tinker_lora', {'rank': lora.rank}))

        def load(host: ModelHost) -> dict[str, Any]:
            with self._undo_on_failure(live):
                host.add_adapter(model_id, lora)
                try:
                    host.load_state(model_id, row.directory, optimizer=optimizer)
                except BaseException:
                    host.remove_adapter(model_id)
                    raise
            self.store.add_training_run(model_id, tenant, session_id, base, _run_config(live), user_metadata)
            return {'model_id': model_id, 'path': path, 'type': 'load_weights'}

        self.models[model_id] = live
        self.workers[base].start_sequence(model_id, 1)
        try:
            live.created_by = self.enqueue(
                tenant, base, call=load, op='load_state', session_id=session_id, traced_model=model_id
            )
        except ApiError:
            self._forget(model_id)
            raise
        return live.created_by

    def load_into_model(self, tenant: str, model_id: str, seq_id: int | None, path: str, optimizer: bool) -> str:
        m = self.model(tenant, model_id)
        cp, row = self.checkpoints.checkpoint(tenant, path, readable=True)
        meta = self.files.read_meta(row.directory)
        if meta['base_model'] != m.base_model or LoraSpec.from_dict(meta['lora']).rank != m.lora.rank:
            raise unprocessable(
                f'checkpoint {path} (base {meta["base_model"]}, rank {meta["lora"]["rank"]}) does '
                f'not match model {model_id} (base {m.base_model}, rank {m.lora.rank})'
            )
        saved = LoraSpec.from_dict(meta['lora']).optimizer
        if optimizer and saved != m.lora.optimizer:
            raise unprocessable(
                f'checkpoint {path} holds {saved} optimizer state but model {model_id} trains with '
                f'{m.lora.optimizer}; load it with optimizer=False, or into a new client'
            )

        def load(host: ModelHost) -> dict[str, Any]:
            host.load_state(model_id, row.directory, optimizer=optimizer)
            return {'path': path, 'model_id': model_id, 'type': 'load_weights'}

        return self.enqueue(tenant, m.base_model, call=load, model_id=model_id, seq_id=seq_id, op='load_state')

    def forward_backward(
        self, tenant: str, model_id: str, seq_id: int | None, batch: TrainBatch, post: Callable[[Any], Any]
    ) -> str:
        m = self.model(tenant, model_id)
        self.store.touch_training_run(model_id)
        return self.enqueue(tenant, m.base_model, train=batch, post=post, model_id=model_id, seq_id=seq_id)

    def optim_step(self, tenant: str, model_id: str, seq_id: int | None, step: OptimStep) -> str:
        m = self.model(tenant, model_id)
        family = m.lora.optimizer
        if not isinstance(step, OPTIMIZERS.get(family, AdamStep)):
            sent = next((name for name, cls in OPTIMIZERS.items() if isinstance(step, cls)), '?')
            raise unprocessable(
                f'model {model_id} was created with the {family} optimizer; optim_step sent {sent} '
                f'parameters (send {"DimuonParams" if family == "dimuon" else "AdamParams"})'
            )
        return self.enqueue(
            tenant,
            m.base_model,
            call=lambda e: {'metrics': e.optim_step(model_id, step)},
            model_id=model_id,
            seq_id=seq_id,
            op='optim_step',
        )

    def call(self, tenant: str, model_id: str, fn: Callable[[ModelHost], Any], seq_id: int | None = None) -> str:
        m = self.model(tenant, model_id)
        return self.enqueue(tenant, m.base_model, call=fn, model_id=model_id, seq_id=seq_id, op='native_call')

    def unload(self, model_id: str) -> None:
        m = self.models.get(model_id)
        if m is None:
            return
        self.workers[m.base_model].end_sequence(model_id)
        self.workers[m.base_model].submit(
            Work(
                m.tenant,
                on_done=lambda r: None,
                on_error=lambda e: None,
                call=lambda e: e.remove_adapter(model_id),
                op='unload',
            )
        )
        self._forget(model_id)

    @contextlib.contextmanager
    def _undo_on_failure(self, live: LiveModel) -> Iterator[None]:
        """A model whose creation failed is forgotten (its id answers 404, its seq_ids are dropped)."""
        try:
            yield
        except BaseException:
            self.workers[live.base_model].end_sequence(live.model_id)
            self._forget(live.model_id)
            raise

    def _forget(self, model_id: str) -> None:
        self.models.pop(model_id, None)
        with self._lock:
            self._seen.pop(model_id, None)

    # ---- sessions and sampling -----------------------------------------------------------------------------
    def require_session(self, tenant: str, session_id: str) -> None:
        state = self.store.session_state(session_id, tenant)
        if state is None:
            raise not_found('session', session_id)
        if state == 'finished':
            raise ApiError(410, f'session {session_id!r} has finished; create a new session')

    def finish_session(
        self, tenant: str, session_id: str, reason: str | None = None, detail: str | None = None
    ) -> None:
        """Finish a session (`reason`: the client's `success` / `errored` / `interrupted`, first one wins): its
        models are unloaded and its unnamed sampling snapshots deleted."""
        self.require_session(tenant, session_id)
        self.store.finish_session(session_id, reason, detail)
        self.custom_losses.drop_session(session_id)
        for model_id in [k for k, m in self.models.items() if m.session_id == session_id]:
            self.unload(model_id)
            for snap in self.store.checkpoints(tenant, model_id, hidden=True):
                self.checkpoints.delete_checkpoint(tenant, model_id, snap.checkpoint_id)

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
        """Cancel one of `tenant`'s sampling requests: queued, it is dropped before it runs; running, its future
        answers the cancellation at once (the sampler finishes its batch; that result is discarded). Either way
        the future fails with a `category: user` error saying it was cancelled. A finished request is left as it
        is; any other kind of request cannot be cancelled (400)."""
        row = self.store.future(request_id, tenant)
        if row is None:
            raise not_found('request', request_id)
        if row.state != 'pending':
            return
        if row.target is None:
            raise bad_request(f'request {request_id!r} is not a sampling request; only sampling can be cancelled')
        exc = ApiError(499, f'request {request_id} was cancelled by the client (cancel_future)', category='user')
        for worker in self.workers.values():
            if worker.cancel(request_id, exc):
                return
        self.futures.reject(request_id, exc)

    # ---- copies --------------------------------------------------------------------------------------------
    def copy_weights(
        self,
        tenant: str,
        source_path: str,
        *,
        reader: str,
        session_id: str | None = None,
        model_seq_id: int | None = None,
        project_id: str | None = None,
        ttl_seconds: int | None = None,
    ) -> str:
        """Copy a checkpoint `reader` may read (`tenant` itself, or the tenant of a `weights_access_token`) into a
        new training run of `tenant` that cannot be trained on: `{session_id}:train:{model_seq_id}` in one of
        `tenant`'s active sessions, or else in a new session (finished at once; in `project_id`). The copy keeps
        the source's kind and name and shares its files (hard links); returns its path."""
        _, source = self.checkpoints.checkpoint(reader, source_path, readable=True)
        ttl = self.checkpoints.check_ttl(ttl_seconds)
        meta = self.files.read_meta(source.directory)
        if session_id is not None:
            if model_seq_id is None or isinstance(model_seq_id, bool) or model_seq_id < 0:
                raise bad_request('copy_weights with session_id also needs model_seq_id (an integer >= 0)')
            self.require_session(tenant, session_id)
            run_id = f'{session_id}:train:{model_seq_id}'
            if run_id in self.models or self.store.training_run(run_id, tenant) is not None:
                raise bad_request(f'training run {run_id!r} exists already; copy into an unused model_seq_id')
        else:
            session_id = f'sess-{uuid.uuid4().hex[:16]}'
            self.store.add_session(
                session_id, tenant, ['copy_weights'], None, project_id, None, 'success', f'copy of {source_path}'
            )
            run_id = f'{session_id}:train:0'
        lora = {'lora': meta['lora'], 'tinker_lora': meta.get('tinker_lora', {'rank': meta['lora']['rank']})}
        self.store.add_training_run(run_id, tenant, session_id, meta['base_model'], {**lora, 'copy_of': source_path})
        return self.checkpoints.copy_to_run(source, tenant, run_id, ttl)

    def reap_sessions(self) -> None:
        """Unload the models of sessions whose heartbeats stopped more than `session_ttl_s` ago."""
        cutoff = time.time() - self.config.session_ttl_s
        for m in list(self.models.values()):
            seen = self.store.session_last_seen(m.session_id)
            if seen is None or seen < cutoff:
                logger.info('unloading %s: its session ended or stopped heart-beating', m.model_id)
                self.unload(m.model_id)


def _run_config(m: LiveModel) -> dict[str, Any]:
    return {'lora': m.lora.as_dict(), 'tinker_lora': m.tinker_lora}
