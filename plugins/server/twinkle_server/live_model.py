"""`LiveModel`: a tenant's training model while the server holds it (what the training and checkpoint operations of
the service share about it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinkle_server.model_host.base import LoraSpec

__all__ = ['LiveModel']


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
