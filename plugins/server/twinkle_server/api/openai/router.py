"""The OpenAI-compatible routes: `GET /v1/models[/{model}]`, `POST /v1/chat/completions`, `POST /v1/completions`.

Authenticated with the server's API keys (``Authorization: Bearer <key>``, or `X-API-Key`), rate-limited and
throttled like every route. Every error of these routes, a missing key included, is in OpenAI's shape
(`errors.py`; the app answers a 404/405 for any other path under /v1 in it too: `errors.unrouted`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from twinkle_server.api.deps import service, tenant
from twinkle_server.api.openai import bounds, streaming
from twinkle_server.api.openai import models as model_names
from twinkle_server.api.openai.chat import ChatRenderer
from twinkle_server.api.openai.errors import OpenAIError, as_openai_error, invalid
from twinkle_server.api.openai.responses import chat_choice, completion_choice, new_id
from twinkle_server.api.openai.rollout_call import SESSION_HEADER, SessionCall
from twinkle_server.api.openai.sampling import (
    ClientWatch,
    check_unsupported,
    default_max_tokens,
    sample,
    sampling_params,
    stop_strings,
)
from twinkle_server.api.openai.schemas import (
    MAX_TOP_LOGPROBS,
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ModelList,
    SamplingFields,
    Usage,
)
from twinkle_server.api.openai.text import Detokenizer, tokenizer_for
from twinkle_server.errors import ApiError
from twinkle_server.service.auth import Tenant
from twinkle_server.service.core import Service

logger = logging.getLogger(__name__)
M = TypeVar('M', bound=BaseModel)
#: `max_tokens` of a legacy completion that gives none (OpenAI's default)
COMPLETION_DEFAULT_MAX_TOKENS = 16


class OpenAIRoute(APIRoute):
    """A route whose every error (its dependencies' too) is answered in OpenAI's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except OpenAIError:
                raise
            except ApiError as exc:
                raise as_openai_error(exc) from None
            except RequestValidationError as exc:
                raise invalid(f'invalid request: {exc.errors()[0].get("msg")}') from None
            except StarletteHTTPException as exc:
                raise OpenAIError(exc.status_code, str(exc.detail)) from None
            except Exception as exc:
                logger.exception('unhandled error on %s', request.url.path)
                raise as_openai_error(exc) from None

        return run


router = APIRouter(route_class=OpenAIRoute)


@dataclass(frozen=True)
class TextTools:
    """A served model's tokenizer, chat renderer and detokenizer."""

    tokenizer: Any
    renderer: ChatRenderer
    detokenizer: Detokenizer
    chars_per_token: int  # the most characters one token decodes to (`bounds.chars_per_token`)


@functools.cache
def _text_tools(model_dir: str) -> TextTools:
    tok = tokenizer_for(model_dir)
    return TextTools(tok, ChatRenderer(tok), Detokenizer(tok), bounds.chars_per_token(tok))


async def _authenticated(request: Request) -> tuple[Service, Tenant]:
    return service(request), tenant(request)


async def _body(request: Request, svc: Service, model: type[M]) -> M:
    """The JSON body as `model`; a 400 naming every bad field (`param`: the first), or for a body over the `/v1`
    cap (`bounds.body_limit`): that body is read and discarded, never held or parsed."""
    contexts = [h.max_context_length for h in svc.hosts.values()]
    limit = bounds.body_limit(contexts, svc.config.max_body_bytes)
    declared = request.headers.get('content-length', '')
    over = declared.isdigit() and int(declared) > limit
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():  # read to the end even when refusing: the client reads the 400 then
        size += len(chunk)
        over = over or size > limit
        if over:
            chunks.clear()
        else:
            chunks.append(chunk)
    if over:
        raise bounds.too_large(max(size, int(declared) if declared.isdigit() else 0), limit, max(contexts, default=0))
    raw = b''.join(chunks)
    try:
        return model.model_validate_json(raw or b'{}')
    except ValidationError as exc:
        errors = exc.errors()
        where = ['.'.join(str(p) for p in e['loc']) for e in errors]
        problems = '; '.join(f'{w or "body"}: {e["msg"]}' for w, e in zip(where, errors))
        raise invalid(f'invalid request: {problems}', param=where[0] or None) from None


# ---- models -----------------------------------------------------------------------------------------------------
@router.get('/v1/models')
async def list_models(request: Request) -> dict[str, Any]:
    svc, who = await _authenticated(request)
    cards = await run_in_threadpool(model_names.cards, svc, who.name)
    return ModelList(data=cards).model_dump(mode='json')


@router.get('/v1/models/{model:path}')
async def get_model(model: str, request: Request) -> dict[str, Any]:
    svc, who = await _authenticated(request)
    return (await run_in_threadpool(model_names.card, svc, who.name, model)).model_dump(mode='json')


# ---- chat -------------------------------------------------------------------------------------------------------
@router.post('/v1/chat/completions', response_model=None)
async def chat_completions(request: Request) -> Response:
    """A chat completion; in a rollout session when the `SESSION_HEADER` header or ``rollout_session`` names one."""
    svc, who = await _authenticated(request)
    req = await _body(request, svc, ChatCompletionRequest)
    session_id = request.headers.get(SESSION_HEADER) or req.rollout_session
    session = None
    if session_id is not None:
        session = await run_in_threadpool(SessionCall.open, svc, who.name, session_id, req)
    return await chat(request, svc, who, req, session)


async def chat(
    request: Request, svc: Service, who: Tenant, req: ChatCompletionRequest, session: SessionCall | None = None
) -> Response:
    """Answer `req`; inside rollout session `session`, its prompt is built and its tokens recorded by it."""
    check_unsupported(req)
    if req.response_format is not None and req.response_format.get('type', 'text') != 'text':
        raise invalid('response_format: only {"type": "text"} is supported by this server', param='response_format')
    top = _chat_logprobs(req)
    target = model_names.resolve(svc, who.name, session.row.model if session is not None else req.model)
    host = svc.host(target.base_model)
    tools = await run_in_threadpool(_text_tools, host.model_dir)
    if session is not None:
        req = session.prepare(req)
    bounds.check_chat(req, host.max_context_length, tools.chars_per_token)
    rendered = await run_in_threadpool(tools.renderer.render, req)
    encode = functools.partial(_encode, tools.tokenizer, special=False)
    if session is not None:
        prompt = await run_in_threadpool(session.prompt, encode, rendered.text)
    else:
        prompt = await run_in_threadpool(encode, rendered.text)
    n = _n(svc, who, req, 1)
    stop = stop_strings(req)
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    left = _context_left(host.max_context_length, len(prompt), 'messages')
    max_tokens = asked if asked is not None else default_max_tokens(svc, who.name, left)
    _check_max_tokens(svc, who, asked)
    params = sampling_params(req, max_tokens=max_tokens, top_logprobs=top or 0, stop=stop, context_left=left)
    async with ClientWatch(request) as gone:
        sequences = await sample(svc, who.name, target, prompt, params, n, gone)
    det = tools.detokenizer

    def build() -> Any:
        decoded = [
            det.sequence(s.tokens, s.logprobs, s.top_logprobs, s.stop_reason, stop, rendered.prefill) for s in sequences
        ]
        if session is not None:
            session.record(det, rendered, prompt, sequences, decoded)
        usage = _usage(len(prompt), sum(len(s.tokens) for s in sequences))
        ident, created = new_id('chatcmpl'), int(time.time())
        if req.stream:
            include = req.stream_options is not None and req.stream_options.include_usage
            return list(
                streaming.chat_events(
                    ident, created, req.model, det, decoded, rendered, top, usage if include else None
                )
            )
        choices = [chat_choice(i, det, seq, rendered, top) for i, seq in enumerate(decoded)]
        return ChatCompletion(id=ident, created=created, model=req.model, choices=choices, usage=usage)

    out = await run_in_threadpool(build)
    if isinstance(out, list):
        return StreamingResponse(iter(out), media_type='text/event-stream', headers=streaming.HEADERS)
    return JSONResponse(out.model_dump(mode='json'))


def _chat_logprobs(req: ChatCompletionRequest) -> int | None:
    """None without `logprobs`, else the alternatives asked per token."""
    k = req.top_logprobs or 0
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise invalid(f'top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {k}', param='top_logprobs')
    if k and not req.logprobs:
        raise invalid('top_logprobs needs logprobs: true', param='top_logprobs')
    return k if req.logprobs else None


# ---- completions ------------------------------------------------------------------------------------------------
@router.post('/v1/completions', response_model=None)
async def completions(request: Request) -> Response:
    svc, who = await _authenticated(request)
    req = await _body(request, svc, CompletionRequest)
    check_unsupported(req)
    if req.echo:
        raise invalid('echo is not supported by this server', param='echo')
    if req.suffix:
        raise invalid('suffix is not supported by this server', param='suffix')
    if req.best_of not in (None, 1):
        raise invalid('best_of is not supported by this server (only 1)', param='best_of')
    top = req.logprobs
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise invalid(f'logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}', param='logprobs')
    target = model_names.resolve(svc, who.name, req.model)
    host = svc.host(target.base_model)
    items = _prompt_items(req.prompt)
    n = _n(svc, who, req, len(items))
    tools = await run_in_threadpool(_text_tools, host.model_dir)
    bounds.check_prompt_items(items, host.max_context_length, tools.chars_per_token)
    prompts = await run_in_threadpool(_prompts, tools.tokenizer, items)
    stop = stop_strings(req)
    _check_max_tokens(svc, who, req.max_tokens)
    settings = []
    for ids in prompts:
        left = _context_left(host.max_context_length, len(ids), 'prompt')
        max_tokens = req.max_tokens if req.max_tokens is not None else min(COMPLETION_DEFAULT_MAX_TOKENS, left)
        settings.append(
            sampling_params(req, max_tokens=max_tokens, top_logprobs=top or 0, stop=stop, context_left=left)
        )
    async with ClientWatch(request) as gone:
        results = await asyncio.gather(
            *(sample(svc, who.name, target, ids, params, n, gone) for ids, params in zip(prompts, settings))
        )
    det = tools.detokenizer

    def build() -> Any:
        decoded = [det.sequence(s.tokens, s.logprobs, s.top_logprobs, s.stop_reason, stop) for r in results for s in r]
        usage = _usage(sum(map(len, prompts)), sum(len(s.tokens) for r in results for s in r))
        ident, created = new_id('cmpl'), int(time.time())
        if req.stream:
            include = req.stream_options is not None and req.stream_options.include_usage
            return list(
                streaming.completion_events(ident, created, req.model, det, decoded, top, usage if include else None)
            )
        choices = [completion_choice(i, det, seq, top) for i, seq in enumerate(decoded)]
        return Completion(id=ident, created=created, model=req.model, choices=choices, usage=usage)

    out = await run_in_threadpool(build)
    if isinstance(out, list):
        return StreamingResponse(iter(out), media_type='text/event-stream', headers=streaming.HEADERS)
    return JSONResponse(out.model_dump(mode='json'))


def _prompt_items(prompt: str | list[str] | list[int] | list[list[int]]) -> list[Any]:
    """The request's prompts, each a text or a list of token ids; a 400 when there are none."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        items = [prompt]
    else:
        items = list(prompt)
    if not items:
        raise invalid('prompt is empty', param='prompt')
    return items


def _prompts(tokenizer: Any, items: list[Any]) -> list[list[int]]:
    """The prompts (`_prompt_items`) as token ids: text is tokenized (with the tokenizer's special tokens, e.g. a
    BOS), ids are checked against the vocabulary."""
    vocab = len(tokenizer)
    out = []
    for i, item in enumerate(items):
        ids = _encode(tokenizer, item, True) if isinstance(item, str) else list(item)
        if not ids:
            raise invalid(f'prompt {i} has no tokens', param='prompt')
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise invalid(f'prompt {i} holds token id {bad}, outside the vocabulary [0, {vocab})', param='prompt')
        out.append(ids)
    return out


# ---- shared checks ----------------------------------------------------------------------------------------------
def _encode(tokenizer: Any, text: str, special: bool) -> list[int]:
    """`text`'s token ids (`special`: with the tokenizer's own added tokens, e.g. a BOS)."""
    return list(tokenizer(text, add_special_tokens=special)['input_ids'])


def _n(svc: Service, who: Tenant, req: SamplingFields, prompts: int) -> int:
    """`n`, checked against the tenant's `max_num_samples` for all the request's choices together."""
    n = 1 if req.n is None else req.n
    if n < 1:
        raise invalid(f'n must be >= 1, got {n}', param='n')
    cap = svc.config.limits(who.name).max_num_samples
    if cap is not None and n * prompts > cap:
        raise invalid(
            f'{n * prompts} choices ({prompts} prompt(s) x n={n}) exceed the server limit max_num_samples={cap}',
            param='n',
        )
    return n


def _check_max_tokens(svc: Service, who: Tenant, asked: int | None) -> None:
    cap = svc.config.limits(who.name).max_sample_tokens
    if asked is not None and cap is not None and asked > cap:
        raise invalid(f'max_tokens ({asked}) exceeds the server limit max_sample_tokens={cap}', param='max_tokens')


def _context_left(context: int, prompt: int, param: str) -> int:
    if prompt >= context:
        raise invalid(
            f"the prompt has {prompt} tokens; this model's context length is {context}",
            param=param,
            code='context_length_exceeded',
        )
    return context - prompt


def _usage(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )
