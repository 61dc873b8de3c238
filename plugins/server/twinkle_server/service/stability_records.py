"""The records StableReinforce's provenance is checked against (`api/tinker/stability.py` applies them): each
sequence sampled with ``record_stability_info=true`` -- its request's prompt tokens, its sampled tokens and their
log-probs -- under its ``sequence_id``. Records belong to the tenant and session that sampled them and live for
`ttl_s` (a day, as Tinker documents) after their last use; memory is bounded by `max_tokens` (all tenants) and
`max_tokens_per_tenant`, least recently used first out.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from twinkle_server.errors import unprocessable

DAY_S = 24 * 3600.0


@dataclass
class Recorded:
    """One sampled sequence: its request's prompt (shared by the request's sequences) and what was sampled."""

    tenant: str
    session_id: str
    prompt: np.ndarray  # int64
    tokens: np.ndarray  # int64
    logprobs: np.ndarray  # float32, one per sampled token
    used: float  # last use (clock seconds)

    @property
    def cost(self) -> int:
        return len(self.prompt) + len(self.tokens)


class StabilityRecords:
    """sequence_id -> `Recorded`, bounded and expiring (module docstring). Thread-safe: sampling results arrive on
    worker threads, training requests read on the event loop."""

    def __init__(
        self,
        *,
        ttl_s: float = DAY_S,
        max_tokens: int = 32_000_000,
        max_tokens_per_tenant: int = 8_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.max_tokens, self.max_tokens_per_tenant = ttl_s, max_tokens, max_tokens_per_tenant
        self._clock = clock
        self._records: OrderedDict[str, Recorded] = OrderedDict()  # least recently used first
        self._tokens = 0
        self._by_tenant: dict[str, int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._records)

    def pending(self, tenant: str, session_id: str, prompt: list[int]) -> PendingSample:
        """A recorder for one sample request: it commits once both its result and its sequence ids are known."""
        return PendingSample(self, tenant, session_id, np.asarray(prompt, dtype=np.int64))

    def add(self, sequence_id: str, rec: Recorded) -> None:
        with self._lock:
            self._drop(sequence_id)
            self._records[sequence_id] = rec
            self._tokens += rec.cost
            self._by_tenant[rec.tenant] = self._by_tenant.get(rec.tenant, 0) + rec.cost
            self._expire()
            if self._by_tenant[rec.tenant] > self.max_tokens_per_tenant:
                for key in [k for k, r in self._records.items() if r.tenant == rec.tenant]:
                    if self._by_tenant.get(rec.tenant, 0) <= self.max_tokens_per_tenant:
                        break
                    self._drop(key)
            while self._tokens > self.max_tokens and self._records:
                self._drop(next(iter(self._records)))

    def lookup(self, tenant: str, session_id: str, sequence_id: str) -> Recorded | None:
        """The record of `sequence_id` if `tenant`'s session `session_id` sampled it and it has not expired; a hit
        restarts its time to live."""
        with self._lock:
            self._expire()
            rec = self._records.get(sequence_id)
            if rec is None or rec.tenant != tenant or rec.session_id != session_id:
                return None
            rec.used = self._clock()
            self._records.move_to_end(sequence_id)
            return rec

    def _expire(self) -> None:
        cutoff = self._clock() - self.ttl_s
        while self._records:
            key, rec = next(iter(self._records.items()))
            if rec.used >= cutoff:
                break
            self._drop(key)

    def _drop(self, key: str) -> None:
        rec = self._records.pop(key, None)
        if rec is not None:
            self._tokens -= rec.cost
            self._by_tenant[rec.tenant] -= rec.cost
            if not self._by_tenant[rec.tenant]:
                del self._by_tenant[rec.tenant]


class PendingSample:
    """Records one sample request's sequences. The result (`fill`, on the worker thread) and the sequence ids
    (`bind`, once the route knows its request id) may come in either order; the second one commits."""

    def __init__(self, records: StabilityRecords, tenant: str, session_id: str, prompt: np.ndarray) -> None:
        self.records, self.tenant, self.session_id, self.prompt = records, tenant, session_id, prompt
        self._ids: list[str] | None = None
        self._sequences: list[Any] | None = None
        self._lock = threading.Lock()

    def fill(self, response: Any) -> None:
        """`response`: a `SampleResponse` (its `sequences` carry `tokens` and `logprobs`)."""
        with self._lock:
            self._sequences = list(response.sequences)
            self._commit()

    def bind(self, sequence_ids: list[str]) -> None:
        with self._lock:
            self._ids = list(sequence_ids)
            self._commit()

    def _commit(self) -> None:
        if self._ids is None or self._sequences is None:
            return
        now = self.records._clock()
        for sid, seq in zip(self._ids, self._sequences):
            tokens = np.asarray(seq.tokens, dtype=np.int64)
            logprobs = np.asarray(seq.logprobs if seq.logprobs is not None else [np.nan] * len(tokens), np.float32)
            self.records.add(sid, Recorded(self.tenant, self.session_id, self.prompt, tokens, logprobs, now))


def recorder(
    records: StabilityRecords, tenant: str, session_id: str | None, record: bool | None, prompt: list[int]
) -> PendingSample | None:
    """The recorder of a sample request (None unless it asked for `record_stability_info`); `session_id`: the
    session of its sampling session (a 422 when it has none: records belong to a session)."""
    if not record:
        return None
    if not session_id:
        raise unprocessable('record_stability_info needs a sampling session (records belong to its session)')
    return records.pending(tenant, session_id, prompt)


def recorded(pending: PendingSample | None, response: Any) -> Any:
    """`response`, recorded first when the request asked for it (`recorder`); for a sample route's `post`."""
    if pending is not None:
        pending.fill(response)
    return response
