"""`ServiceCore`: what the service's operations (`training.TrainingOperations`, `sampling.SamplingOperations`,
`checkpoints.CheckpointOperations`) use of `core.Service` -- its parts and the rules they share. Each operations
object holds this one object instead of a set of callbacks and shared dictionaries; `Service` implements it."""

from __future__ import annotations

from typing import Any, Protocol

from twinkle_server.config import ServerConfig
from twinkle_server.engine.model_host.base import ModelHost
from twinkle_server.engine.scheduler import ModelWorker
from twinkle_server.service.futures import FutureTable
from twinkle_server.service.hub_push import HubPusher
from twinkle_server.service.live_model import LiveModel, LiveModels
from twinkle_server.service.quotas import Quotas
from twinkle_server.store import Store
from twinkle_server.store.checkpoint_files import CheckpointFiles


class ServiceCore(Protocol):
    config: ServerConfig
    store: Store  # the metadata store
    files: CheckpointFiles  # checkpoint directories
    pusher: HubPusher  # checkpoint pushes to the hubs
    quotas: Quotas  # per-request and per-tenant limits
    workers: dict[str, ModelWorker]  # each base model's scheduler
    futures: FutureTable
    models: LiveModels  # the tenants' live training models

    def host(self, base_model: str) -> ModelHost:
        """The served base model's host (404 otherwise)."""
        ...

    def model(self, tenant: str, model_id: str) -> LiveModel:
        """The tenant's live training model (404 otherwise, saying how to resume one the server forgot)."""
        ...

    def enqueue(self, tenant: str, base_model: str, **work: Any) -> str:
        """Queue work on the base model's host (`Service.enqueue`); returns the request's future id."""
        ...

    def require_session(self, tenant: str, session_id: str) -> None:
        """404 / 410 unless `session_id` is the tenant's active session."""
        ...

    def forget(self, model_id: str) -> None:
        """Drop a live model and its recent seq_ids."""
        ...
