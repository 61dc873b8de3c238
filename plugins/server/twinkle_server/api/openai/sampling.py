"""OpenAI sampling fields -> `SamplingParams`, and sampling through the service: the same `svc.sampling.sample` the
Tinker `asample` route queues on (the model's worker, batched with every tenant's samples; the tenant's limits
`max_num_samples`, `max_sample_tokens`, `max_pending_futures` apply), awaited here instead of polled."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from twinkle_core.types import SampleResponse, SamplingParams
from twinkle_server.api.openai.errors import OpenAIError, from_failure, invalid
from twinkle_server.api.openai.models import Target
from twinkle_server.api.openai.schemas import MAX_STOP, SamplingFields
from twinkle_server.engine.model_host.base import SampleJob
from twinkle_server.service.core import Service

logger = logging.getLogger(__name__)
POLL_S = 30.0
INT64 = 2**63


@dataclass(frozen=True)
class Sequence:
    """One sampled continuation, as the sampler returned it."""

    tokens: list[int]
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[int, float]]] | None
    stop_reason: str


def stop_strings(req: SamplingFields) -> list[str]:
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > MAX_STOP:
        raise invalid(f'stop has {len(stop)} sequences; at most {MAX_STOP} are accepted', param='stop')
    if any(not s for s in stop):
        raise invalid('stop sequences must not be empty', param='stop')
    return stop


def check_unsupported(req: SamplingFields) -> None:
    """Refuse the fields this server knows but cannot serve, unless they hold their neutral value."""
    for name in ('presence_penalty', 'frequency_penalty'):
        if getattr(req, name) not in (None, 0, 0.0):
            raise invalid(f'{name} is not supported by this server (only 0)', param=name)
    if req.logit_bias:
        raise invalid('logit_bias is not supported by this server', param='logit_bias')


def sampling_params(
    req: SamplingFields, *, max_tokens: int, top_logprobs: int, stop: list[str], context_left: int
) -> SamplingParams:
    """The sampler's settings for `req`; a 400 naming the field for a value out of range. `context_left`: the
    positions the prompt leaves free (`max_tokens` must fit in them)."""
    temperature = 1.0 if req.temperature is None else req.temperature
    if not 0.0 <= temperature <= 2.0:
        raise invalid(f'temperature must be in [0, 2], got {temperature}', param='temperature')
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0.0 < top_p <= 1.0:
        raise invalid(f'top_p must be in (0, 1], got {top_p}', param='top_p')
    top_k = -1 if req.top_k is None else req.top_k
    if top_k == 0 or top_k < -1:
        raise invalid(f'top_k must be -1 (off) or >= 1, got {top_k}', param='top_k')
    if req.seed is not None and not -INT64 <= req.seed < INT64:
        raise invalid('seed must fit in a signed 64-bit integer', param='seed')
    if max_tokens < 1:
        raise invalid(f'max_tokens must be >= 1, got {max_tokens}', param='max_tokens')
    if max_tokens > context_left:
        raise invalid(
            f"this model's context length leaves {max(context_left, 0)} tokens after the prompt, but "
            f'{max_tokens} were asked for; shorten the prompt or lower max_tokens',
            param='max_tokens',
            code='context_length_exceeded',
        )
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop=stop or None,
            seed=req.seed,
            top_logprobs=top_logprobs,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        raise invalid(f'{err["loc"][0]}: {err["msg"]}', param=str(err['loc'][0])) from None


def default_max_tokens(svc: Service, tenant: str, context_left: int) -> int:
    """`max_tokens` when the request gives none: what the context leaves, within the tenant's `max_sample_tokens`."""
    cap = svc.config.limits(tenant).max_sample_tokens
    return max(1, min(context_left, cap) if cap is not None else context_left)


async def sample(
    svc: Service,
    tenant: str,
    target: Target,
    prompt: list[int],
    params: SamplingParams,
    n: int,
    gone: asyncio.Event | None = None,
) -> list[Sequence]:
    """`n` continuations of `prompt`, queued like the Tinker `asample` route's and awaited; an `OpenAIError` for
    a refusal or a failure. `gone` (set when the client disconnected, `ClientWatch`): the request is cancelled
    (`SamplingOperations.cancel`: dropped if still queued; if running, its rows stopped at the sampler's next
    decode step and its result discarded) and a 499 raised."""
    job = SampleJob(prompt=prompt, params=params, num_samples=n)
    resolved = svc.sampling.resolve_target(tenant, None, target.model_path, target.base_model)
    request_id = svc.sampling.sample(tenant, resolved, job, post=_compact)
    try:
        row = await _finished(svc, tenant, request_id, gone)
    except asyncio.CancelledError:  # the handler was cancelled (shutdown, or the server noticed the client left)
        svc.sampling.cancel(request_id, 'because its HTTP request ended')
        raise
    if row is None:
        how = svc.sampling.cancel(request_id, 'because the client disconnected')
        logger.info('/v1 sample request %s: the client disconnected, cancelled (%s)', request_id, how or 'finished')
        raise OpenAIError(499, f'the client disconnected; request {request_id} was cancelled')
    body = json.loads(row.body or b'{}')
    if row.state != 'done':
        raise from_failure(body)
    return [
        Sequence(s['tokens'], s.get('logprobs'), s.get('top_logprobs'), s['stop_reason']) for s in body['sequences']
    ]


async def _finished(svc: Service, tenant: str, request_id: str, gone: asyncio.Event | None) -> Any:
    """The request's finished row, or None when `gone` was set first."""
    waiting = asyncio.ensure_future(_row(svc, tenant, request_id))
    if gone is None:
        return await waiting
    left = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait({waiting, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
        if not waiting.done():
            waiting.cancel()
    return waiting.result() if waiting.done() and not waiting.cancelled() else None


async def _row(svc: Service, tenant: str, request_id: str) -> Any:
    while True:
        row = await svc.futures.wait(request_id, tenant, POLL_S)
        if row is None:
            raise OpenAIError(500, f'the sampling request {request_id} was lost')
        if row.state != 'pending':
            return row


class ClientWatch:
    """Watches a request's connection while it is served: `gone` is set once the client disconnects (its ASGI
    ``http.disconnect``). Use after the body was read, as ``async with ClientWatch(request) as gone:``."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.gone = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> asyncio.Event:
        self._task = asyncio.ensure_future(self._watch())
        return self.gone

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            message = await self.request.receive()
            if message.get('type') == 'http.disconnect':
                self.gone.set()
                return


def _compact(result: Any) -> dict[str, Any]:
    """What a finished request keeps of the sampler's answer (its future's JSON value): tokens, log-probs, top
    alternatives, stop reasons."""
    r = result if isinstance(result, SampleResponse) else SampleResponse.model_validate(result)
    return {
        'sequences': [
            {
                'tokens': s.tokens,
                'logprobs': s.logprobs,
                'top_logprobs': [[list(p) for p in step] for step in s.top_logprobs] if s.top_logprobs else None,
                'stop_reason': s.stop_reason,
            }
            for s in r.sequences
        ]
    }
