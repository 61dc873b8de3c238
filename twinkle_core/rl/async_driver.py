"""`AsyncRLDriver`: rollouts and training overlap, with bounded staleness (docs/async_rl.md).

Two threads share one process: a rollout thread calls the worker (sampling -- on a local sampler, whose torch
kernels run outside the GIL, or on a Ray sampler group, which computes in its own actors) and puts scored
`RolloutGroup`\\ s into a `RolloutBuffer`; the trainer (the caller's thread) takes ``groups_per_step`` of them per
step, trains, and publishes the new weights as the next policy version. Policy version ``v`` = the weights after
``v`` optimizer steps; the groups trained at step ``s`` were sampled with a version ``>= s - max_staleness``:

- the worker starts a call only when the newest published version is recent enough for every group the call
  makes (by the buffer position they will take), and loads the newest weights right before it (never during a
  sample call); ``max_staleness=0`` therefore alternates exactly like a synchronous loop;
- the trainer drops (and counts) any group older than that all the same;
- partial rollouts (an episode spanning several sample calls, e.g. the turns of a multi-turn rollout):
  ``'finish'`` keeps the weights of the call's start until the call ends (the whole call is of one version);
  ``'continue'`` lets the worker load newer weights between its sample calls (`RolloutContext.refresh`), the
  episode records each token's version and the group's ``policy_version`` is its oldest.

A worker that raises is rebuilt from its factory (up to ``max_worker_restarts`` times; the failed call's groups
are lost and produced again) and gets the newest weights in full.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any, Callable, Literal, Protocol, Sequence

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.rl.policy_weights import PolicyWeights
from twinkle_core.rl.rollout_buffer import BufferClosed, RolloutBuffer
from twinkle_core.rl.rollout_group import RolloutContext, RolloutGroup
from twinkle_core.rl.train_step import summarize_off_policy

PartialRollouts = Literal['finish', 'continue']


class RolloutWorker(Protocol):
    """Makes scored groups with its own ``sampler`` (which the driver keeps up to date). A worker that declares
    ``adapter_name`` (the sampler adapter it samples with; None: the base weights) is checked to sample the policy
    the driver publishes (`check_samples_the_policy`)."""

    sampler: Any

    def __call__(self, context: RolloutContext) -> Sequence[RolloutGroup]: ...


TrainStep = Callable[[list[RolloutGroup], int], dict[str, Any]]


@dataclass
class StepRecord:
    """One training step: the groups' versions and staleness, drops, how long the trainer waited for data and
    trained, and `train_step`'s metrics."""

    step: int
    versions: list[int]
    dropped: int
    wait_s: float
    train_s: float
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def staleness(self) -> list[int]:
        return [self.step - v for v in self.versions]


@dataclass
class RunReport:
    """A whole run: the steps, drops, worker restarts, and each thread's busy intervals (start, end) in seconds
    since the run began, from which `busy_fraction` gives sampler / trainer utilisation."""

    steps: list[StepRecord]
    dropped: int
    worker_restarts: int
    wall_s: float
    rollout_busy: list[tuple[float, float]]
    trainer_busy: list[tuple[float, float]]
    #: (policy version, the evaluator's metrics) of every evaluation of the run (`AsyncRLDriver.run`'s `evaluator`)
    evaluations: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def busy_fraction(self, who: Literal['rollout', 'trainer']) -> float:
        spans = self.rollout_busy if who == 'rollout' else self.trainer_busy
        return sum(end - start for start, end in spans) / max(self.wall_s, 1e-9)

    def summary(self) -> dict[str, float]:
        staleness = [s for record in self.steps for s in record.staleness]
        return {
            'wall_s': self.wall_s,
            'staleness_mean': fmean(staleness) if staleness else 0.0,
            'staleness_max': float(max(staleness, default=0)),
            'dropped': float(self.dropped),
            'worker_restarts': float(self.worker_restarts),
            'rollout_busy': self.busy_fraction('rollout'),
            'trainer_busy': self.busy_fraction('trainer'),
            **summarize_off_policy([record.metrics for record in self.steps]),
        }


def check_samples_the_policy(worker: Any, policy_adapter: str | None) -> None:
    """Raise when `worker` declares an ``adapter_name`` other than `policy_adapter`, the sampler adapter the policy
    arrives as (None: a full-parameter policy, in the base weights): its rollouts would not come from the policy
    being trained (e.g. a LoRA policy sampled with ``adapter_name=None`` gets the base model's samples)."""
    samples_with = getattr(worker, 'adapter_name', _UNDECLARED)
    if samples_with is _UNDECLARED or samples_with == policy_adapter:
        return
    policy = 'the base weights (full-parameter training)' if policy_adapter is None else f'adapter {policy_adapter!r}'
    sampled = 'the base weights' if samples_with is None else f'adapter {samples_with!r}'
    raise InvalidInputError(
        f"The policy reaches the worker's sampler as {policy}, but the worker samples with {sampled}: its rollouts "
        f'would not come from the policy being trained. Give the worker (or its rollout) adapter_name='
        f'{policy_adapter!r}.'
    )


_UNDECLARED = object()


class AsyncRLDriver:
    """Run `train_step` on groups from `worker_factory()`'s worker while it samples the next ones.

    Args:
        model: the training model (its weights are published after every step through `PolicyWeights`).
        worker_factory: builds the rollout worker (called once, and again after a worker failure).
        train_step: ``(groups, step) -> metrics``: forward_backward + optimizer step on the groups.
        groups_per_step: groups trained per step; ``groups_per_call``: groups one worker call returns (smaller
            calls stream finer: the trainer starts as soon as a step's groups are in).
        max_staleness: the most optimizer steps a trained group may lag behind (0 = synchronous).
        partial_rollouts: ``'finish'`` or ``'continue'`` (see the module docstring).
        max_worker_restarts: worker failures tolerated before the run fails.
        adapter_name: the model's LoRA adapter to publish (default: its only one, if any).
    """

    def __init__(
        self,
        model: Any,
        worker_factory: Callable[[], RolloutWorker],
        train_step: TrainStep,
        *,
        groups_per_step: int,
        groups_per_call: int | None = None,
        max_staleness: int = 1,
        partial_rollouts: PartialRollouts = 'finish',
        max_worker_restarts: int = 3,
        adapter_name: str | None = None,
    ) -> None:
        if partial_rollouts not in ('finish', 'continue'):
            raise InvalidInputError(f"partial_rollouts must be 'finish' or 'continue', got {partial_rollouts!r}.")
        self.groups_per_call = groups_per_call or groups_per_step
        if self.groups_per_call < 1:
            raise InvalidInputError(f'groups_per_call must be >= 1, got {self.groups_per_call}.')
        self.buffer = RolloutBuffer(groups_per_step, max_staleness)
        self.worker_factory, self.train_step = worker_factory, train_step
        self.partial_rollouts, self.max_worker_restarts = partial_rollouts, max_worker_restarts
        self.worker = worker_factory()
        self.weights = PolicyWeights(model, self.worker.sampler, adapter_name=adapter_name)
        check_samples_the_policy(self.worker, self.weights.sampler_adapter)
        self.worker_restarts = 0
        self._rollout_busy: list[tuple[float, float]] = []
        self._t0 = 0.0

    # ---- trainer side (the caller's thread) ------------------------------------------------------------------
    def run(
        self,
        steps: int,
        on_step: Callable[[StepRecord], None] | None = None,
        *,
        evaluator: Callable[[int], dict[str, float]] | None = None,
        eval_every: int = 0,
    ) -> RunReport:
        """Train `steps` steps (policy versions 1..steps); `on_step` sees each step's record as it ends. A driver
        runs once (its buffer and versions start at 0): build a new one for another run.

        `evaluator(version)` (e.g. `twinkle_core.eval.evaluate` on a sampler sharing the trainer's weights, with
        ``step=version``) runs on the trainer's thread before the first step and after every `eval_every`-th step
        and the last, between two steps, so it sees exactly that policy version; the rollout thread keeps sampling
        meanwhile. Its metrics are in `RunReport.evaluations`."""
        if self._t0:
            raise TwinkleError('AsyncRLDriver.run() was already called; build a new driver for another run.')
        if evaluator is not None and eval_every < 1:
            raise InvalidInputError(f'eval_every must be >= 1 with an evaluator, got {eval_every}.')
        evaluations: list[tuple[int, dict[str, float]]] = []
        if evaluator is not None:
            evaluations.append((0, dict(evaluator(0))))
        self._t0 = time.monotonic()
        self.weights.publish(0)
        thread = threading.Thread(target=self._rollout_loop, name='twinkle-rollout', daemon=True)
        thread.start()
        records: list[StepRecord] = []
        trainer_busy: list[tuple[float, float]] = []
        try:
            for step in range(steps):
                waited = time.monotonic()
                groups, dropped = self.buffer.take(step)
                started = time.monotonic()
                metrics = self.train_step(groups, step)
                self.weights.publish(step + 1)
                self.buffer.notify()  # wakes a worker waiting for this version
                ended = time.monotonic()
                trainer_busy.append((started - self._t0, ended - self._t0))
                versions = [int(g.policy_version) for g in groups if g.policy_version is not None]
                record = StepRecord(step, versions, dropped, started - waited, ended - started, dict(metrics))
                records.append(record)
                if evaluator is not None and ((step + 1) % eval_every == 0 or step + 1 == steps):
                    evaluations.append((step + 1, dict(evaluator(step + 1))))
                if on_step is not None:
                    on_step(record)
        except BufferClosed as exc:
            raise TwinkleError(f'The rollout worker failed: {exc}') from exc.__cause__
        finally:
            self.buffer.close()
            thread.join(timeout=60)
        return RunReport(
            records,
            self.buffer.dropped,
            self.worker_restarts,
            time.monotonic() - self._t0,
            list(self._rollout_busy),
            trainer_busy,
            evaluations,
        )

    # ---- rollout side (its own thread) ---------------------------------------------------------------------------
    def _rollout_loop(self) -> None:
        call_index = 0
        try:
            while True:
                self._wait_for_fresh_enough_weights()
                started = time.monotonic()
                try:  # loading the weights is part of the call: a sampler that died fails here too
                    version = self.weights.apply_latest()
                    refresh = self.weights.apply_latest if self.partial_rollouts == 'continue' else _constant(version)
                    groups = list(self.worker(RolloutContext(call_index, version, refresh)))
                except Exception as exc:  # noqa: BLE001 - a worker failure restarts the worker
                    self._restart_worker(exc)
                    continue
                self._rollout_busy.append((started - self._t0, time.monotonic() - self._t0))
                for group in groups:
                    if group.policy_version is None:
                        group.policy_version = version
                self.buffer.put(groups)
                call_index += 1
        except BufferClosed:
            return
        except BaseException as exc:  # noqa: BLE001 - reported to the trainer thread
            self.buffer.close(exc)

    def _wait_for_fresh_enough_weights(self) -> None:
        """Block until the newest published version may sample the groups of the next call: the last of them
        is trained at step ``(position + groups_per_call - 1) // groups_per_step``."""
        buffer = self.buffer
        with buffer.cv:
            buffer.wait_for(
                lambda: (
                    self.weights.latest_version
                    >= (buffer.position() + self.groups_per_call - 1) // buffer.groups_per_step - buffer.max_staleness
                )
            )

    def _restart_worker(self, exc: Exception) -> None:
        if self.worker_restarts >= self.max_worker_restarts:
            raise TwinkleError(
                f'The rollout worker failed {self.worker_restarts + 1} times (max_worker_restarts='
                f'{self.max_worker_restarts}); last error: {type(exc).__name__}: {exc}'
            ) from exc
        self.worker_restarts += 1
        _shutdown(self.worker)
        self.worker = self.worker_factory()
        check_samples_the_policy(self.worker, self.weights.sampler_adapter)
        self.weights.rebind(self.worker.sampler)

    def close(self) -> None:
        """Release the weight publication and shut the worker's sampler down (a vLLM engine, a Ray group), if it
        has a ``shutdown``."""
        self.weights.close()
        _shutdown(self.worker)


def _shutdown(worker: Any) -> None:
    shutdown = getattr(getattr(worker, 'sampler', None), 'shutdown', None)
    if callable(shutdown):
        try:
            shutdown()
        except Exception:  # noqa: BLE001 - a failed worker's sampler may be half gone
            pass


def _constant(version: int) -> Callable[[], int]:
    return lambda: version
