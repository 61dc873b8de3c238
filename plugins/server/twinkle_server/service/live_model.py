"""`LiveModel`: a tenant's training model while the server holds it; `LiveModels`: all of them, by model id (the
service owns it; its operations reach it through `ServiceCore.models`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from twinkle_server.engine.model_host.base import LoraSpec

__all__ = ['LiveModel', 'LiveModels']


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
    steps: int = 0  # forward_backward passes done: the step its per-step metrics are recorded under


class LiveModels:
    """The live training models by model id. Ownership is checked by `Service.model` (another tenant's id is a
    404); this is the table. Changed on the event loop only."""

    def __init__(self) -> None:
        self._by_id: dict[str, LiveModel] = {}

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._by_id

    def __getitem__(self, model_id: str) -> LiveModel:
        return self._by_id[model_id]

    def __iter__(self) -> Iterator[LiveModel]:
        """A snapshot of the live models (safe while models come and go)."""
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, model_id: str) -> LiveModel | None:
        return self._by_id.get(model_id)

    def add(self, live: LiveModel) -> None:
        self._by_id[live.model_id] = live

    def pop(self, model_id: str) -> LiveModel | None:
        return self._by_id.pop(model_id, None)

    def count(self, *, tenant: str | None = None, base_model: str | None = None) -> int:
        """How many live models the tenant has, or the base model hosts."""
        return sum(
            1
            for m in self._by_id.values()
            if (tenant is None or m.tenant == tenant) and (base_model is None or m.base_model == base_model)
        )
