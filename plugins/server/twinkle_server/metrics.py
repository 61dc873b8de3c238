"""Prometheus metrics at `GET /metrics`, in the text exposition format 0.0.4 (no client library needed).

Counters and histograms are counted where the work happens: the scheduler times every call into a model host and
counts its tokens (`Metrics.host_call`; the public metric names say "engine call" for it), `HttpMetricsMiddleware`
counts HTTP requests by route template and status. Gauges (queue depth, running work, pending futures, live
adapters) are `Gauges` callables handed to `Metrics.watch` by their owner (the service) and read when the endpoint
is scraped; process memory is read here. This module knows nothing of the service. Labels name base models,
operations and routes, never tenants: `/metrics` answers without an API key (bind the server to localhost or keep
the path behind the proxy; docs/server.md, "Operations").
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from fastapi import APIRouter, Request
from fastapi.responses import Response

from twinkle_server.asgi import Message, Receive, Scope, Send

__all__ = ['CONTENT_TYPE', 'Family', 'Gauges', 'HttpMetricsMiddleware', 'Metrics', 'render', 'router', 'snapshot']

CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8'
#: host call durations, seconds (a tiny model's step is milliseconds, a large one's or a save is seconds)
ENGINE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
Labels = tuple[tuple[str, str], ...]
HTTP_METHODS = frozenset({'GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'})  # any other: `other`


@dataclass
class Family:
    """One metric family: its samples are (name suffix, labels, value), e.g. ('_bucket', {'le': '0.1'}, 3)."""

    name: str
    type: str  # counter | gauge | histogram
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def add(self, labels: dict[str, str], value: float, suffix: str = '') -> Family:
        self.samples.append((suffix, labels, value))
        return self

    def text(self) -> str:
        lines = [f'# HELP {self.name} {_escape_help(self.help)}', f'# TYPE {self.name} {self.type}']
        lines += [f'{self.name}{suffix}{_labels(labels)} {_number(value)}' for suffix, labels, value in self.samples]
        return '\n'.join(lines) + '\n'


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break
        self.sum += value
        self.count += 1

    def samples(self, labels: dict[str, str]) -> Iterable[tuple[str, dict[str, str], float]]:
        cumulative = 0
        for bound, n in zip(self.buckets, self.counts):
            cumulative += n
            yield '_bucket', {**labels, 'le': _number(bound)}, cumulative
        yield '_bucket', {**labels, 'le': '+Inf'}, self.count
        yield '_sum', labels, self.sum
        yield '_count', labels, self.count


@dataclass(frozen=True)
class Gauges:
    """The live values `/metrics` reports, each a callable read when the endpoint is scraped (from the event loop:
    they must be cheap and thread-safe to read)."""

    #: base model -> kind of work (train, sample, call) -> accepted items not yet running
    queue_depths: Callable[[], Mapping[str, Mapping[str, int]]]
    #: base model -> work items in the host call running now
    running: Callable[[], Mapping[str, int]]
    #: base model -> training models (LoRA adapters) loaded
    live_adapters: Callable[[], Mapping[str, int]]
    #: requests accepted and not finished
    pending_futures: Callable[[], int]
    #: whether the server is draining before it shuts down
    draining: Callable[[], bool]


class Metrics:
    """The server's counters and histograms, and the `Gauges` its owner hands it (`watch`). Thread-safe: worker
    threads and the event loop update them."""

    def __init__(self, buckets: tuple[float, ...] = ENGINE_BUCKETS) -> None:
        self.gauges: Gauges | None = None
        self._buckets = buckets
        self._lock = threading.Lock()
        self._calls: dict[Labels, _Histogram] = {}
        self._items: dict[Labels, int] = defaultdict(int)
        self._tokens: dict[Labels, int] = defaultdict(int)
        self._http: dict[Labels, int] = defaultdict(int)

    def watch(self, gauges: Gauges) -> None:
        """Report `gauges` from now on (replacing any watched before)."""
        self.gauges = gauges

    def host_call(
        self,
        model: str,
        op: str,
        seconds: float,
        *,
        done: int = 0,
        failed: int = 0,
        tokens: dict[str, int] | None = None,
    ) -> None:
        """One call of `op` into the host of `model` that took `seconds`: `done`/`failed` work items, `tokens` processed
        by operation (e.g. ``{'sample': 40, 'sample_prompt': 12}``)."""
        with self._lock:
            key = (('model', model), ('op', op))
            hist = self._calls.get(key)
            if hist is None:
                hist = self._calls[key] = _Histogram(self._buckets)
            hist.observe(seconds)
            for outcome, n in (('done', done), ('failed', failed)):
                if n:
                    self._items[(*key, ('outcome', outcome))] += n
            for token_op, n in (tokens or {}).items():
                self._tokens[(('model', model), ('op', token_op))] += n

    def work_failed(self, model: str, op: str, n: int = 1) -> None:
        """Work that failed without a host call (its seq_id never came, the server shut down, ...)."""
        with self._lock:
            self._items[(('model', model), ('op', op), ('outcome', 'failed'))] += n

    def http_request(self, method: str, route: str, status: int) -> None:
        with self._lock:
            self._http[(('method', method), ('route', route), ('status', str(status)))] += 1

    def families(self) -> list[Family]:
        with self._lock:
            calls = Family(
                'twinkle_engine_call_seconds',
                'histogram',
                'Duration of engine calls by base model and operation (one call may serve several '
                'requests: a mixed forward/backward pass, a sampling batch).',
            )
            for key, hist in sorted(self._calls.items()):
                calls.samples.extend(hist.samples(dict(key)))
            items = Family(
                'twinkle_work_items_total',
                'counter',
                'Engine work items (one per request) finished, by base model, operation and outcome.',
            )
            tokens = Family(
                'twinkle_tokens_total',
                'counter',
                'Tokens processed by base model and operation: input tokens of forward_backward and '
                'forward, generated tokens (sample) and prompt tokens (sample_prompt) of sampling.',
            )
            http = Family(
                'twinkle_http_requests_total',
                'counter',
                'HTTP requests answered, by method, route template and status code.',
            )
            for family, counts in ((items, self._items), (tokens, self._tokens), (http, self._http)):
                for key, n in sorted(counts.items()):
                    family.add(dict(key), n)
        return [calls, items, tokens, http]


def snapshot(metrics: Metrics) -> list[Family]:
    """Every family `/metrics` reports: the watched gauges, then the counters and histograms, then process memory
    (the console's operator view shows them as a page)."""
    return [*_gauges(metrics.gauges), *metrics.families(), *_memory()]


def render(metrics: Metrics) -> str:
    """The whole exposition (`snapshot` as text)."""
    return ''.join(f.text() for f in snapshot(metrics))


def _gauges(gauges: Gauges | None) -> list[Family]:
    if gauges is None:
        return []
    queue = Family(
        'twinkle_queue_depth',
        'gauge',
        'Accepted engine work not yet running (queued, or waiting for an earlier seq_id), by base model '
        'and kind (train, sample, call).',
    )
    running = Family('twinkle_running_work', 'gauge', 'Work items in the engine call running now, by base model.')
    adapters = Family('twinkle_live_adapters', 'gauge', 'Training models (LoRA adapters) loaded, by base model.')
    running_now = gauges.running()
    for name, depths in sorted(gauges.queue_depths().items()):
        for kind, n in depths.items():
            queue.add({'model': name, 'kind': kind}, n)
        running.add({'model': name}, running_now.get(name, 0))
    for name, n in sorted(gauges.live_adapters().items()):
        adapters.add({'model': name}, n)
    pending = Family('twinkle_pending_futures', 'gauge', 'Requests accepted and not finished (queued or running).')
    pending.add({}, gauges.pending_futures())
    draining = Family('twinkle_draining', 'gauge', '1 while the server drains before shutting down, else 0.')
    draining.add({}, 1 if gauges.draining() else 0)
    return [queue, running, pending, adapters, draining]


def _memory() -> list[Family]:
    out = []
    rss = _rss_bytes()
    if rss is not None:
        out.append(Family('process_resident_memory_bytes', 'gauge', 'Resident memory size in bytes.').add({}, rss))
    torch = sys.modules.get('torch')  # never import torch (or initialise CUDA) just to report on it
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        allocated = Family(
            'twinkle_cuda_memory_allocated_bytes',
            'gauge',
            'GPU memory held by tensors (torch.cuda.memory_allocated), by device.',
        )
        reserved = Family(
            'twinkle_cuda_memory_reserved_bytes',
            'gauge',
            "GPU memory reserved by torch's caching allocator (torch.cuda.memory_reserved), by device.",
        )
        for i in range(torch.cuda.device_count()):
            allocated.add({'device': f'cuda:{i}'}, torch.cuda.memory_allocated(i))
            reserved.add({'device': f'cuda:{i}'}, torch.cuda.memory_reserved(i))
        out += [allocated, reserved]
    return out


def _rss_bytes() -> int | None:
    """Current resident set size (Linux /proc); None where unavailable."""
    try:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, ValueError, IndexError):
        return None


def _number(value: float) -> str:
    if math.isnan(value):
        return 'NaN'
    if math.isinf(value):
        return '+Inf' if value > 0 else '-Inf'
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace('\\', '\\\\').replace('\n', '\\n')


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ''
    inner = ','.join(f'{k}="{_escape_label(str(v))}"' for k, v in labels.items())
    return '{' + inner + '}'


def _escape_label(value: str) -> str:
    return value.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n')


# ---- HTTP -----------------------------------------------------------------------------------------------------
router = APIRouter()


@router.get('/metrics', include_in_schema=False)
async def metrics(request: Request) -> Response:
    return Response(render(request.app.state.metrics), media_type=CONTENT_TYPE)


class HttpMetricsMiddleware:
    """ASGI middleware: counts each answered request by method, route template and status. Unknown paths count as
    route `unmatched` and unknown methods as `other`, so the label set stays bounded whatever clients send."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        metrics = getattr(scope['app'].state, 'metrics', None) if scope['type'] == 'http' else None
        if metrics is None:
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message['type'] == 'http.response.start':
                route = getattr(scope.get('route'), 'path', None) or 'unmatched'
                method = scope.get('method', '')
                metrics.http_request(method if method in HTTP_METHODS else 'other', route, message['status'])
            await send(message)

        await self.app(scope, receive, counting_send)
