"""`Work`: one request's unit of work for a model host (a training pass, a sample, or a call); a training model's
request order (`SeqState`); running a batch of compatible work as one host call (`host_call`) and the tokens it
processed (`tokens_of`). The scheduler (`scheduler.ModelWorker`) decides what runs together and when."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from twinkle_server import logs
from twinkle_server.engine.model_host.base import ModelHost, SampleJob, TrainBatch

logger = logging.getLogger(__name__)

Done = Callable[[Any], None]
Failed = Callable[[BaseException], None]
KINDS = ('train', 'sample', 'call')


@dataclass
class Work:
    """A unit of work for a model host. Exactly one of `train`, `sample`, `call` is set."""

    tenant: str
    on_done: Done
    on_error: Failed
    train: TrainBatch | None = None
    sample: SampleJob | None = None
    call: Callable[[ModelHost], Any] | None = None
    model_id: str | None = None  # set (with seq_id) for a training model's ordered requests
    seq_id: int | None = None
    op: str | None = None  # what a `call` does (optim_step, save, ...), for metrics and logs
    context: logs.RequestContext | None = None  # the submitting request's log context (taken by `submit`)
    request_id: str | None = None  # the future it answers (`cancel` finds queued work by it)
    #: set by `cancel` while it runs: the sampler stops its rows at the next decode step (where it declares it can)
    cancelled: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @property
    def kind(self) -> str:
        return 'train' if self.train is not None else 'sample' if self.sample is not None else 'call'

    @property
    def operation(self) -> str:
        """forward_backward, forward, sample, or the call's `op` (default `call`)."""
        if self.train is not None:
            return 'forward' if self.train.forward_only else 'forward_backward'
        return 'sample' if self.sample is not None else self.op or 'call'


@dataclass
class SeqState:
    """A training model's request order: the next seq_id to run, work parked for later ones, ids skipped."""

    next_seq: int = 1
    parked: dict[int, Work] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)
    running: bool = False  # the work of `next_seq` is queued or running
    blocked_since: float | None = None  # when parked work started waiting for a seq_id that has not arrived


def host_call(host: ModelHost, batch: list[Work]) -> list[Any]:
    """Run `batch` (work of one kind: training passes, samples, or a single call) as one call of `host`; one result
    per work, an exception where it failed (a failure of the whole call is every work's)."""
    try:
        if batch[0].train is not None:
            return list(host.forward_backward([w.train for w in batch]))  # type: ignore[misc]
        if batch[0].sample is not None:
            return list(
                host.sample(
                    [w.sample for w in batch],  # type: ignore[misc]
                    should_stop=lambda i: batch[i].cancelled.is_set(),
                )
            )
        return [_call(batch[0].call, host)]  # type: ignore[arg-type]
    except BaseException as exc:  # noqa: BLE001 - the worker must survive anything
        logger.exception('engine call failed')  # log and metric wording: an 'engine call' is a host call
        return [exc] * len(batch)


def tokens_of(batch: list[Work], results: list[Any]) -> dict[str, int]:
    """Tokens the successful items of a host call processed, by operation: input tokens of training passes,
    prompt (`sample_prompt`) and generated (`sample`) tokens of sampling."""
    out: dict[str, int] = {}
    try:
        for work, result in zip(batch, results):
            if isinstance(result, BaseException):
                continue
            if work.train is not None:
                n = sum(len(row.get('input_ids', ())) for row in work.train.rows)
                out[work.operation] = out.get(work.operation, 0) + n
            elif work.sample is not None:
                out['sample_prompt'] = out.get('sample_prompt', 0) + len(work.sample.prompt)
                sequences = getattr(result, 'sequences', None) or []
                out['sample'] = out.get('sample', 0) + sum(len(getattr(s, 'tokens', ())) for s in sequences)
    except Exception:  # noqa: BLE001 - counting must never break the worker
        logger.exception('counting tokens failed')
    return out


def _call(fn: Callable[[ModelHost], Any], host: ModelHost) -> Any:
    try:
        return fn(host)
    except BaseException as exc:  # noqa: BLE001
        return exc
