"""The rows the metadata store (`store.Store`) answers with: one frozen dataclass per table, as read back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    'CheckpointRow',
    'FutureRow',
    'PushRow',
    'RequestRow',
    'RolloutRow',
    'SamplingSessionRow',
    'SessionRow',
    'TrainingRunRow',
]


@dataclass(frozen=True)
class TrainingRunRow:
    run_id: str
    tenant: str
    session_id: str
    base_model: str
    lora_config: dict[str, Any]
    user_metadata: dict[str, Any] | None
    created_at: float
    last_request_time: float
    corrupted: bool


@dataclass(frozen=True)
class CheckpointRow:
    run_id: str
    checkpoint_id: str  # "weights/<name>" or "sampler_weights/<name>"
    tenant: str
    kind: str  # "training" | "sampler"
    directory: str
    size_bytes: int | None
    created_at: float
    user_metadata: dict[str, str] | None
    expires_at: float | None
    listed: bool = True  # False: a snapshot made for a sampling session (unnamed save), hidden from listings
    public: bool = False  # published: readable (loaded, sampled, copied, downloaded) by every tenant


@dataclass(frozen=True)
class SessionRow:
    """A client session. `finish_reason`: the client's reason for finishing it (`success`, `errored`,
    `interrupted`; the first one reported stays), None while it runs or when none was given."""

    session_id: str
    tenant: str
    created_at: float
    last_seen: float
    finished: bool
    tags: list[str]
    user_metadata: Any
    project_id: str | None
    display_name: str | None
    finish_reason: str | None
    finish_detail: str | None


@dataclass(frozen=True)
class SamplingSessionRow:
    sampling_session_id: str
    tenant: str
    session_id: str | None
    base_model: str
    model_path: str | None
    created_at: float


@dataclass(frozen=True)
class FutureRow:
    request_id: str
    tenant: str
    state: str  # "pending" | "done" | "failed"
    content_type: str | None
    body: bytes | None
    target: str | None = None  # the sampling session (and client) whose `retrieve_futures` reports it


@dataclass(frozen=True)
class RequestRow:
    """A future as a session's trace shows it: what it did (`op`), for which model or sampling-session client
    (`model_id`, `target`), how it ended (`state`, `error` of a failed one) and when."""

    request_id: str
    op: str | None
    model_id: str | None
    target: str | None
    state: str
    created_at: float
    finished_at: float | None
    error: bytes | None


@dataclass(frozen=True)
class PushRow:
    """The hub push of one checkpoint: `repo` (``hf://org/name``), where in it (`path_in_repo`), and how it
    went (`state` 'pending' | 'pushed' | 'failed', `error` of a failed one)."""

    run_id: str
    checkpoint_id: str
    tenant: str
    repo: str
    path_in_repo: str
    private: bool
    state: str
    requested_at: float
    pushed_at: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class RolloutRow:
    """A rollout session on `/v1` (`service.rollouts`): the policy it samples and its caps and rewards."""

    session_id: str
    tenant: str
    model: str  # what every call samples: a base model or a saved sampler checkpoint (pinned at creation)
    created_at: float
    expires_at: float
    limits: dict[str, Any]  # max_calls, max_tokens
    rewards: dict[str, Any] | None  # {'reward': x} or {'rewards': [per episode]} once posted
