"""The service core shared by the Tinker routes and the native routes: tenants' live models, sampling
sessions, checkpoints and the queued operations on them. Routes translate wire formats; this module owns
the rules (ownership, limits, seq_id ordering, atomic checkpoints, persistence).

`Service` holds the shared state (hosts and their workers, the live models, futures, store) and queues the work;
the operations on each kind of thing are collaborators it holds and routes call through it: `svc.training`
(`service.training.TrainingOperations`: create, load, train), `svc.sampling` (`service.sampling.SamplingOperations`:
sampling sessions, samples, cancellation) and `svc.checkpoints` (`service.checkpoints.CheckpointOperations`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any, Callable

from twinkle_server import logs
from twinkle_server.config import ServerConfig
from twinkle_server.engine.model_host.base import ModelHost
from twinkle_server.engine.scheduler import ModelWorker, Work
from twinkle_server.errors import ApiError, bad_request, not_found
from twinkle_server.metrics import Gauges, Metrics
from twinkle_server.service.auth import LoginThrottle
from twinkle_server.service.checkpoints import CheckpointOperations
from twinkle_server.service.custom_losses import CustomLossStore
from twinkle_server.service.drain import Drain
from twinkle_server.service.futures import FutureTable
from twinkle_server.service.hub_push import HubPusher
from twinkle_server.service.images import DecodeBudget, ImagePolicy
from twinkle_server.service.live_model import LiveModel, LiveModels
from twinkle_server.service.quotas import Quotas
from twinkle_server.service.rollouts import RolloutOperations
from twinkle_server.service.sampling import SamplingOperations, session_of_target
from twinkle_server.service.sampling import sampling_target as sampling_target  # re-exported: the routes import it
from twinkle_server.service.stability_records import StabilityRecords
from twinkle_server.service.training import TrainingOperations
from twinkle_server.store import Store
from twinkle_server.store.checkpoint_files import CheckpointFiles

logger = logging.getLogger(__name__)
SEEN_PER_MODEL = 4096  # re-posts are retries of recent requests
IDEMPOTENCY_KEEP_S = 24 * 3600


class Service:
    """The service core (module docstring). Checkpoint operations are delegated to `checkpoints`
    (`service.checkpoints.CheckpointOperations`), training-model operations to `training`
    (`service.training.TrainingOperations`), sampling to `sampling` (`service.sampling.SamplingOperations`); the
    `/metrics` gauges are handed to `metrics` (`Metrics.watch`)."""

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
        #: what samples with record_stability_info recorded, for stable_reinforce provenance (service.stability_records)
        self.stability = StabilityRecords()
        #: custom losses uploaded with /create_custom_loss, per tenant and session, in memory
        #: (engine.custom_loss.program)
        self.custom_losses = CustomLossStore()
        self.models = LiveModels()
        # model_id -> {seq_id: request_id} of its recent requests, so a re-posted request gets its original future
        self._seen: dict[str, OrderedDict[int, str]] = {}
        self._lock = threading.Lock()
        self.checkpoints = CheckpointOperations(self, min_ttl_s=config.min_checkpoint_ttl_s)
        self.training = TrainingOperations(self, self.checkpoints)
        self.sampling = SamplingOperations(self, self.checkpoints)
        self.rollouts = RolloutOperations(self.store)
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
        self.training.model_loggers.close()
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
        for m in self.models:
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
            session_id=session_id or (live.session_id if live else None) or session_of_target(target),
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

    # ---- unloading training models (their other operations: `training`) ----------------------------------------------
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
        self.forget(model_id)

    def forget(self, model_id: str) -> None:
        """Drop a live model and its recent seq_ids."""
        self.models.pop(model_id)
        with self._lock:
            self._seen.pop(model_id, None)

    # ---- sessions ------------------------------------------------------------------------------------------
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
        for model_id in [m.model_id for m in self.models if m.session_id == session_id]:
            self.unload(model_id)
            for snap in self.store.checkpoints(tenant, model_id, hidden=True):
                self.checkpoints.delete_checkpoint(tenant, model_id, snap.checkpoint_id)

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
        for m in self.models:
            seen = self.store.session_last_seen(m.session_id)
            if seen is None or seen < cutoff:
                logger.info('unloading %s: its session ended or stopped heart-beating', m.model_id)
                self.unload(m.model_id)
