"""The console's JSON endpoints (polled by `static/console.js`) and checkpoint downloads, for a signed-in tenant
(401 otherwise; 404 for another tenant's ids, as in the API). State-changing requests (delete, sample) must carry
the page's CSRF token. The operator endpoint needs an operator key."""

from __future__ import annotations

import os
import re
import tarfile
import tempfile
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from twinkle_core.types import SamplingParams
from twinkle_server.api.console import session, views
from twinkle_server.api.console.operator import operator_snapshot
from twinkle_server.api.console.session import BASE, ConsoleUser
from twinkle_server.api.deps import json_body, parse
from twinkle_server.api.openai import models as openai_models
from twinkle_server.api.openai.sampling import sample as sample_tokens
from twinkle_server.api.openai.text import tokenizer_for
from twinkle_server.errors import ApiError
from twinkle_server.service.core import Service

__all__ = ['router']

router = APIRouter(include_in_schema=False)
API = f'{BASE}/api'
MAX_PROMPT_CHARS = 20_000


class SampleForm(BaseModel):
    """The playground's request."""

    model_path: str = Field(min_length=1)
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    max_tokens: int = Field(default=32, ge=1, le=4096)


def _user(request: Request) -> tuple[Service, ConsoleUser]:
    user = session.signed_in(request)
    if user is None:
        raise ApiError(401, 'not signed in to the console (or the key was revoked): sign in again at /console')
    return request.app.state.service, user


@router.get(f'{API}/runs')
async def runs(request: Request) -> dict[str, Any]:
    svc, user = _user(request)
    return {'runs': views.run_rows(svc, user.tenant.name)}


@router.get(API + '/runs/{run_id}')
async def run(run_id: str, request: Request) -> dict[str, Any]:
    svc, user = _user(request)
    return views.run_detail(svc, user.tenant.name, run_id)


@router.get(API + '/runs/{run_id}/metrics')
async def run_metrics(run_id: str, request: Request) -> dict[str, Any]:
    svc, user = _user(request)
    return {'run': run_id, 'series': views.metric_series(svc, user.tenant.name, run_id)}


@router.post(API + '/runs/{run_id}/checkpoints/{checkpoint_id:path}/delete')
async def delete_checkpoint(run_id: str, checkpoint_id: str, request: Request) -> dict[str, Any]:
    svc, user = _user(request)
    session.check_csrf(request, user)
    views.owned_run(svc, user.tenant.name, run_id)
    await run_in_threadpool(svc.checkpoints.delete_checkpoint, user.tenant.name, run_id, checkpoint_id)
    return {'deleted': f'{run_id}/{checkpoint_id}'}


@router.get(BASE + '/runs/{run_id}/checkpoints/{checkpoint_id:path}/download')
async def download(run_id: str, checkpoint_id: str, request: Request) -> FileResponse:
    """The checkpoint's files (without the server's metadata file) as one .tar.gz."""
    svc, user = _user(request)
    row = svc.checkpoints.owned(user.tenant.name, run_id, checkpoint_id)
    files = svc.files.files(row.directory)
    fd, archive = tempfile.mkstemp(prefix='twinkle-console-', suffix='.tar.gz')
    os.close(fd)

    def pack() -> None:
        with tarfile.open(archive, 'w:gz') as tar:
            for rel, path in files.items():
                tar.add(path, arcname=rel)

    try:
        await run_in_threadpool(pack)
    except BaseException:
        os.unlink(archive)
        raise
    name = re.sub(r'[^A-Za-z0-9._-]+', '_', f'{run_id}-{checkpoint_id}')
    return FileResponse(
        archive, media_type='application/gzip', filename=f'{name}.tar.gz', background=BackgroundTask(os.unlink, archive)
    )


@router.get(f'{API}/checkpoints')
async def checkpoints(request: Request) -> dict[str, Any]:
    svc, user = _user(request)
    return {'checkpoints': views.checkpoint_choices(svc, user.tenant.name)}


@router.post(f'{API}/sample')
async def sample(request: Request) -> dict[str, Any]:
    """Sample once from a checkpoint (or base model) of the tenant: the text, and each token with its log-prob."""
    svc, user = _user(request)
    session.check_csrf(request, user)
    form = parse(SampleForm, await json_body(request))
    target = openai_models.resolve(svc, user.tenant.name, form.model_path)
    tokenizer = await run_in_threadpool(tokenizer_for, svc.host(target.base_model).model_dir)
    prompt = await run_in_threadpool(lambda: list(tokenizer(form.prompt)['input_ids']))
    params = SamplingParams(max_tokens=form.max_tokens, temperature=form.temperature, logprobs=True)
    (seq,) = await sample_tokens(svc, user.tenant.name, target, prompt, params, 1)
    logprobs: list[float | None] = list(seq.logprobs) if seq.logprobs else [None] * len(seq.tokens)
    return {
        'text': tokenizer.decode(seq.tokens, skip_special_tokens=True),
        'tokens': [{'id': t, 'text': tokenizer.decode([t]), 'logprob': lp} for t, lp in zip(seq.tokens, logprobs)],
        'stop_reason': seq.stop_reason,
    }


@router.get(f'{API}/operator')
async def operator(request: Request) -> dict[str, Any]:
    svc, user = _user(request)
    if not user.admin:
        raise ApiError(403, 'the operator view needs an operator key: twinkle server keys create --admin')
    return operator_snapshot(svc)
