"""The training-model operations of the service: create a training model (fresh, or from a checkpoint), load a
checkpoint into one, and queue its forward/backward passes, optimizer steps and native calls -- within the tenant's
and the host's adapter limits.

`TrainingOperations` is a collaborator `Service` holds (as `training`) and delegates to; it reaches the service
through one narrow object (`core_protocol.ServiceCore`). The live models (`Service.models`, a `LiveModels`) stay with
the service, which also unloads them and needs them for sessions, request traces and the `/metrics` gauges."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Callable, Iterator

from twinkle_server.engine.model_host.base import (
    OPTIMIZERS,
    AdamStep,
    LoraSpec,
    ModelHost,
    OptimStep,
    TrainBatch,
    TrainResult,
)
from twinkle_server.errors import ApiError, unprocessable
from twinkle_server.service.checkpoints import CheckpointOperations
from twinkle_server.service.core_protocol import ServiceCore
from twinkle_server.service.live_model import LiveModel
from twinkle_server.service.lora import lora_targets
from twinkle_server.service.model_loggers import ModelLoggers

__all__ = ['TrainingOperations', 'train_metrics']

logger = logging.getLogger(__name__)


class TrainingOperations:
    """The training operations over `core` (`ServiceCore`: the store, quotas, workers, live models, queueing and
    session rules) and `checkpoints` (where checkpoints are looked up and read)."""

    def __init__(self, core: ServiceCore, checkpoints: CheckpointOperations) -> None:
        self.core, self.checkpoints = core, checkpoints
        #: each model's configured metrics loggers (W&B, SwanLab, ...), fed by `_record`
        self.model_loggers = ModelLoggers({name: spec.loggers for name, spec in core.config.model_specs.items()})

    def _check_new_adapter(self, tenant: str, rank: int, base_model: str) -> None:
        self.core.quotas.check_new_adapter(tenant, rank, self.core.models.count(tenant=tenant))
        host = self.core.host(base_model)
        hosted = self.core.models.count(base_model=base_model)
        if host.max_adapters is not None and hosted >= host.max_adapters:
            raise ApiError(
                403,
                f'base model {base_model!r} is served by {host.backend_name}, which '
                f'trains at most {host.max_adapters} adapter(s) at once; this server hosts '
                f'{hosted} already (free one, or serve the model with a multi-adapter backend, '
                f'e.g. MultiLoraTransformersModel)',
            )

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
        self.core.require_session(tenant, session_id)
        self.core.host(base_model)
        rank = lora.rank if lora is not None else tinker_lora.get('rank')
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise unprocessable(f'lora_config.rank must be an integer >= 1, got {rank!r}')
        self._check_new_adapter(tenant, rank, base_model)
        if lora is None:
            lora = LoraSpec(
                rank,
                self.core.config.lora_alpha,
                lora_targets(tinker_lora),
                tinker_lora.get('seed'),
                optimizer=optimizer,
            )
        model_id = f'{session_id}:train:{model_seq_id}'
        if model_id in self.core.models:
            return self._repost(tenant, model_id)
        live = LiveModel(model_id, tenant, base_model, session_id, lora, tinker_lora)

        def create(host: ModelHost) -> dict[str, Any]:
            with self._undo_on_failure(live):
                host.add_adapter(model_id, lora)
            self.core.store.add_training_run(model_id, tenant, session_id, base_model, _run_config(live), user_metadata)
            return {'model_id': model_id, 'type': 'create_model'}

        return self._start(live, create, 'create_model')

    def _start(self, live: LiveModel, call: Callable[[ModelHost], Any], op: str) -> str:
        """Register `live` and queue its creation `call` as its request 0 (its next seq_id is 1); returns the
        future id. A refused enqueue forgets the model again."""
        self.core.models.add(live)
        self.core.workers[live.base_model].start_sequence(live.model_id, 1)
        try:
            live.created_by = self.core.enqueue(
                live.tenant, live.base_model, call=call, op=op, session_id=live.session_id, traced_model=live.model_id
            )
        except ApiError:
            self.core.forget(live.model_id)
            raise
        return live.created_by

    def _repost(self, tenant: str, model_id: str) -> str:
        """A create/load re-posted for an existing model id (a client retry) gets the original future."""
        live = self.core.models[model_id]
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
        self.core.require_session(tenant, session_id)
        cp, row = self.checkpoints.checkpoint(tenant, path, readable=True)
        meta = self.core.files.read_meta(row.directory)
        base = base_model or meta['base_model']
        if base != meta['base_model']:
            raise unprocessable(f'checkpoint {path} was trained on {meta["base_model"]!r}, not {base!r}')
        if optimizer and cp.kind != 'training':
            raise unprocessable(f'{path} is a sampler checkpoint without optimizer state; load a weights/ checkpoint')
        self.core.host(base)
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
        if model_id in self.core.models:
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
            self.core.store.add_training_run(model_id, tenant, session_id, base, _run_config(live), user_metadata)
            return {'model_id': model_id, 'path': path, 'type': 'load_weights'}

        return self._start(live, load, 'load_state')

    def load_into_model(self, tenant: str, model_id: str, seq_id: int | None, path: str, optimizer: bool) -> str:
        m = self.core.model(tenant, model_id)
        cp, row = self.checkpoints.checkpoint(tenant, path, readable=True)
        meta = self.core.files.read_meta(row.directory)
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

        return self.core.enqueue(tenant, m.base_model, call=load, model_id=model_id, seq_id=seq_id, op='load_state')

    def forward_backward(
        self, tenant: str, model_id: str, seq_id: int | None, batch: TrainBatch, post: Callable[[Any], Any]
    ) -> str:
        m = self.core.model(tenant, model_id)
        self.core.store.touch_training_run(model_id)
        if not batch.forward_only:
            post = self._recording(m, post)
        return self.core.enqueue(tenant, m.base_model, train=batch, post=post, model_id=model_id, seq_id=seq_id)

    def optim_step(self, tenant: str, model_id: str, seq_id: int | None, step: OptimStep) -> str:
        m = self.core.model(tenant, model_id)
        family = m.lora.optimizer
        if not isinstance(step, OPTIMIZERS.get(family, AdamStep)):
            sent = next((name for name, cls in OPTIMIZERS.items() if isinstance(step, cls)), '?')
            raise unprocessable(
                f'model {model_id} was created with the {family} optimizer; optim_step sent {sent} '
                f'parameters (send {"DimuonParams" if family == "dimuon" else "AdamParams"})'
            )

        def stepped(host: ModelHost) -> dict[str, Any]:
            metrics = host.optim_step(model_id, step)
            lr = getattr(step, 'learning_rate', None)
            self._record(m, 'optim_step', {**({'learning_rate': lr} if lr is not None else {}), **(metrics or {})})
            return {'metrics': metrics}

        return self.core.enqueue(tenant, m.base_model, call=stepped, model_id=model_id, seq_id=seq_id, op='optim_step')

    def call(self, tenant: str, model_id: str, fn: Callable[[ModelHost], Any], seq_id: int | None = None) -> str:
        m = self.core.model(tenant, model_id)
        return self.core.enqueue(tenant, m.base_model, call=fn, model_id=model_id, seq_id=seq_id, op='native_call')

    def _recording(self, m: LiveModel, post: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """`post`, after counting the step and recording its metrics (`train_metrics`) for the console."""

        def record(result: Any) -> Any:
            if isinstance(result, TrainResult):
                m.steps += 1
                self._record(m, 'forward_backward', train_metrics(result))
            return post(result)

        return record

    def _record(self, m: LiveModel, op: str, metrics: dict[str, Any]) -> None:
        """Store one step's numeric metrics; a failure is logged, never passed on to the training request."""
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        try:
            self.core.store.add_run_metrics(m.model_id, m.tenant, op, m.steps, numbers)
        except Exception:  # noqa: BLE001 - the console's curves are not worth a failed step
            logger.exception('could not record the %s metrics of %s', op, m.model_id)
        self.model_loggers.record(m.base_model, m.model_id, m.steps, numbers)

    @contextlib.contextmanager
    def _undo_on_failure(self, live: LiveModel) -> Iterator[None]:
        """A model whose creation failed is forgotten (its id answers 404, its seq_ids are dropped)."""
        try:
            yield
        except BaseException:
            self.core.workers[live.base_model].end_sequence(live.model_id)
            self.core.forget(live.model_id)
            raise


def train_metrics(result: TrainResult) -> dict[str, float]:
    """What a forward_backward reports: its summed loss and the host's ``name:reduction`` metrics."""
    return {'loss:sum': result.loss, **{k: v for k, v in result.metrics.items() if ':' in k}}


def _run_config(m: LiveModel) -> dict[str, Any]:
    return {'lora': m.lora.as_dict(), 'tinker_lora': m.tinker_lora}
