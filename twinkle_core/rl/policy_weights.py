"""Versioned, non-blocking weight publication from a trainer to a sampler that runs concurrently.

`LatestWeightsEngine` is a `CheckpointEngine` that keeps only the newest weights of each label (``base``,
``adapter``) with the policy version they belong to: `send` never waits for a receiver and a receiver never gets
a stale update after a newer one. `PolicyWeights` pairs it with two `CheckpointEngineManager`\\ s -- one exporting
from the training model (on the trainer's thread, right after an optimizer step), one applying into the sampler
(on the sampler's thread, between its sample calls) -- so the sampler is never written to while it samples.

Tensors are cloned on `send`: the trainer goes on updating its parameters in place while the sampler has not yet
applied them (the cost: one extra copy of the exported weights in host memory). A model and a sampler hosted in two
device groups of the runtime (Ray) skip the mailbox: their weights move group to group at `publish`.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.runtime.context import current_runtime
from twinkle_core.weight_sync.base import ADAPTER, BASE, CheckpointEngine, LabelledBucket, WeightUpdate
from twinkle_core.weight_sync.manager import CheckpointEngineManager, synced_adapter, weight_sharing


class LatestWeightsEngine(CheckpointEngine):
    """Latest-wins mailbox: it holds, per label (base, adapter), only the newest buckets sent and their version.

    `stamp` is the version the next `send` publishes. `receive(since=v)` returns, base before adapter, the labels
    whose newest buckets are of a version after `v` (every label when `v` is None), stamped with the newest
    version in its metadata's ``policy_version``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[int, list[list[tuple[str, Any]]]]] = {}  # label -> (version, buckets)
        self._metadata: dict[str, Any] = {}
        self.stamp = 0
        self.version = -1  # newest version published (-1: nothing yet)

    def send(self, buckets: Iterable[LabelledBucket], *, metadata: dict[str, Any] | None = None) -> None:
        fresh: dict[str, list[list[tuple[str, Any]]]] = {}
        for label, bucket in buckets:
            fresh.setdefault(label, []).append([(name, _clone(t)) for name, t in bucket])
        with self._lock:
            for label, label_buckets in fresh.items():
                self._latest[label] = (self.stamp, label_buckets)
            self._metadata = dict(metadata or {})
            self.version = self.stamp

    def receive(self, since: int | None = None) -> WeightUpdate:
        with self._lock:
            if not self._latest:
                raise TwinkleError('LatestWeightsEngine.receive(): nothing was published yet.')
            picked = [
                (label, bucket)
                for label in (BASE, ADAPTER)
                if label in self._latest and (since is None or self._latest[label][0] > since)
                for bucket in self._latest[label][1]
            ]
            return WeightUpdate(picked, {**self._metadata, 'policy_version': self.version})


class PolicyWeights:
    """The trainer publishes numbered policy versions; the sampler side applies the newest between its calls.

    ``publish(version)`` (trainer thread) exports `model`'s weights as that version; ``apply_latest()`` (sampler
    thread) loads the newest published version into `sampler` if it has not got it yet and returns the version
    the sampler now runs. ``rebind(sampler)`` points the receiving side at a new sampler (after a restart): its
    next `apply_latest` loads every label again. The sampler must hold its own copy of the weights (built from
    ``model_id=``): one that shares the training module would see parameters change mid-sample.

    When the model and the sampler are hosted in two device groups of the runtime (a Ray training group and a Ray
    sampler group), the weights move actor to actor instead (the runtime's weight sync): `publish` sends them to
    the sampler group at once. The sampler actor runs its calls one at a time, so they land between two sample
    calls, never during one; a call that starts while they travel is labelled with the older version (its
    staleness is over-, never under-counted). A rebound sampler gets the model's current weights right away. A
    publish that fails to reach the sampler group (its actor died) does not fail the trainer: the sampler side's
    next `apply_latest` raises it, which makes the driver rebuild the worker (and rebind).
    """

    def __init__(
        self, model: Any, sampler: Any, *, adapter_name: str | None = None, sampler_adapter_name: str | None = None
    ) -> None:
        self.engine = LatestWeightsEngine()
        self._model = model
        self._names: dict[str, Any] = {'adapter_name': adapter_name, 'sampler_adapter_name': sampler_adapter_name}
        self._sender: Any = None  # exports into `engine` (when the weights travel through this process)
        self._hosted: Any = None  # the runtime's group-to-group sync (when model and sampler are hosted)
        self._undelivered: Exception | None = None  # why the last hosted publish failed (until a rebind)
        self._publish_lock = threading.Lock()
        self._published = -1  # the newest version published (by either path)
        self.sampler_version = -1
        self.rebind(sampler)

    @property
    def sampler_adapter(self) -> str | None:
        """The sampler adapter the policy arrives as: the model's LoRA adapter under its sampler-side name, or None
        for a full-parameter policy (it arrives as the sampler's base weights)."""
        adapter = synced_adapter(self._model, self._names['adapter_name'])
        return None if adapter is None else self._names['sampler_adapter_name'] or adapter

    @property
    def latest_version(self) -> int:
        """The newest published version (-1 before the first `publish`)."""
        return self._published

    def rebind(self, sampler: Any) -> None:
        """Apply future updates to `sampler` (a fresh one: it gets every label of the next update)."""
        sharing = weight_sharing(sampler, self._model)
        if sharing != 'none':
            raise InvalidInputError(
                f'An asynchronous run needs a sampler with its own weights, but this one shares {sharing!r} of them '
                'with the training model (it would read parameters while the trainer updates them); build it from '
                'model_id= instead of model=.'
            )
        with self._publish_lock:
            runtime = current_runtime()
            _close_quietly(self._hosted)  # the old sampler group may be gone (a crashed actor)
            self._hosted = None if runtime is None else runtime.weight_sync(self._model, sampler, **self._names)
            self._sampler = sampler
            self._undelivered = None
            self.sampler_version = -1  # a fresh sampler: its next update carries every label
            if self._hosted is not None and self._published >= 0:
                self._hosted.sync_weights()  # the current weights, at least as new as the latest version
                self.sampler_version = self._published
        if self._hosted is None and self._sender is None:
            self._sender = CheckpointEngineManager(model=self._model, engine=self.engine, **self._names)

    def publish(self, version: int) -> None:
        """Export the model's current weights as `version` (call between optimizer steps, on the trainer thread)."""
        with self._publish_lock:
            if self._hosted is None:
                self.engine.stamp = version
                self._sender.sync_weights()
            else:
                try:
                    self._hosted.sync_weights()
                except Exception as exc:  # noqa: BLE001 - e.g. the sampler actor died: the rollout side restarts it
                    self._undelivered = exc
                else:
                    self.sampler_version = version
            self._published = version  # only now: a call that waits for this version starts after the sync

    def apply_latest(self) -> int:
        """Load the newest published version into the sampler unless it runs it already; returns its version."""
        if self._hosted is not None:  # published straight into the sampler group
            if self._undelivered is not None:
                raise TwinkleError(
                    f'Policy version {self._published} did not reach the sampler group: '
                    f'{type(self._undelivered).__name__}: {self._undelivered}'
                ) from self._undelivered
            return self.sampler_version
        newest = self.engine.version
        if newest < 0 or newest == self.sampler_version:
            return self.sampler_version
        view = _Since(self.engine, None if self.sampler_version < 0 else self.sampler_version)
        CheckpointEngineManager(sampler=self._sampler, engine=view).sync_weights()
        self.sampler_version = view.received_version
        return self.sampler_version

    def close(self) -> None:
        """Release the group-to-group sync's side process group, if there is one."""
        with self._publish_lock:
            _close_quietly(self._hosted)
            self._hosted = None


class _Since(CheckpointEngine):
    """A receive-only view of a `LatestWeightsEngine` that returns what was published after a version."""

    def __init__(self, engine: LatestWeightsEngine, since: int | None) -> None:
        self._engine, self._since = engine, since
        self.received_version = -1

    def send(self, buckets: Iterable[LabelledBucket], *, metadata: dict[str, Any] | None = None) -> None:
        raise TwinkleError('A receiving view of LatestWeightsEngine cannot send.')

    def receive(self) -> WeightUpdate:
        update = self._engine.receive(since=self._since)
        self.received_version = int(update.metadata['policy_version'])
        return update


def _close_quietly(sync: Any) -> None:
    if sync is None:
        return
    try:
        sync.close()
    except Exception:  # noqa: BLE001 - a side of it may have died; nothing is left to release there
        pass


def _clone(tensor: Any) -> Any:
    clone = getattr(tensor, 'clone', None)
    return clone() if callable(clone) else tensor
