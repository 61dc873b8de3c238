"""Tinker checkpoint routes: save/load weights, sampler weights, external weights (PEFT export + signed download
URLs), weights_info, copies, publish/unpublish, TTLs, run and checkpoint listings.

A refused request frees its seq_id through the request guard (`api/guard.py`); routes just raise. The rules (who may
read, publish, expire, copy) live in `service/checkpoints.py`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool
from tinker import types

from twinkle_server.api.deps import json_body, parse, service, tenant
from twinkle_server.api.tinker.optimizers import optimizer_family
from twinkle_server.errors import bad_request, not_found, unprocessable
from twinkle_server.service.auth import Tenant, key_from_headers
from twinkle_server.service.checkpoints import DOWNLOAD_PATH
from twinkle_server.service.core import Service
from twinkle_server.service.hub_push import listing_fields, listing_metadata
from twinkle_server.store import CheckpointRow, PushRow, TrainingRunRow
from twinkle_server.store.checkpoint_files import SEGMENT_KIND, CheckpointPath

router = APIRouter(prefix='/api/v1')
MAX_OFFSET = 2**62  # list offsets are SQL integers (64-bit)
MAX_IDEMPOTENCY_KEY = 256


#: what each named save route writes, as (sampler weights, with the optimizer state, an external PEFT export): a
#: training state (for load_weights), sampler weights, or an adapter whose files download (`external_weights_urls`)
SAVES: dict[str, tuple[bool, bool, bool]] = {
    'save_weights': (False, True, False),
    'save_weights_for_sampler': (True, False, False),
    'save_weights_external': (False, False, True),
}


def _save(svc: Service, who: Tenant, route: str, req: Any, post: Any = None) -> dict:
    """Queue the named save of `route` (`SAVES`) for `req` (its `path` is the checkpoint's name)."""
    if not req.path:
        raise bad_request(f'{route} needs a checkpoint name in `path`')
    sampler, optimizer, external = SAVES[route]
    rid = svc.checkpoints.save(
        who.name,
        req.model_id,
        req.seq_id,
        req.path,
        sampler=sampler,
        optimizer=optimizer,
        external=external,
        user_metadata=getattr(req, 'user_metadata', None),
        ttl_seconds=req.ttl_seconds,
        post=post,
    )
    return {'request_id': rid, 'model_id': req.model_id}


@router.post('/save_weights')
async def save_weights(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    return _save(svc, who, 'save_weights', parse(types.SaveWeightsRequest, await json_body(request)))


@router.post('/save_weights_external')
async def save_weights_external(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    """Export the adapter in Hugging Face PEFT format (`adapter_model.safetensors`, `adapter_config.json`) as
    `tinker://{run}/external_weights/{name}`; its files download through `external_weights_urls`. The future's
    value is `{path, size_bytes}`. age encryption is not supported (400)."""
    req = parse(types.SaveWeightsExternalRequest, await json_body(request))
    if req.age_encryption_recipients:
        raise bad_request(
            'age_encryption_recipients is not supported by this server: external weights are stored unencrypted '
            "(on the server operator's disk); leave it unset, and encrypt after download if needed"
        )

    def done(uri: str) -> dict[str, Any]:
        row = svc.store.checkpoint(req.model_id, f'external_weights/{req.path}', who.name)
        return {'path': uri, 'size_bytes': row.size_bytes if row else None, 'type': 'save_weights_external'}

    return _save(svc, who, 'save_weights_external', req, post=done)


@router.post('/save_weights_for_sampler')
async def save_weights_for_sampler(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    """Sampler weights under a name (`path`), or, with `sampling_session_seq_id` instead, a snapshot that a new
    sampling session samples from."""
    req = parse(types.SaveWeightsForSamplerRequest, await json_body(request))
    if req.path:
        return _save(
            svc,
            who,
            'save_weights_for_sampler',
            req,
            post=lambda uri: {'path': uri, 'type': 'save_weights_for_sampler'},
        )
    if req.sampling_session_seq_id is None:
        raise bad_request('save_weights_for_sampler needs `path` (a name) or `sampling_session_seq_id`')
    session_id = req.model_id.split(':train:')[0]
    rid = svc.checkpoints.save_for_new_sampler(
        who.name, req.model_id, req.seq_id, session_id, req.sampling_session_seq_id
    )
    return {'request_id': rid, 'model_id': req.model_id}


@router.post('/load_weights')
async def load_weights(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    req = parse(types.LoadWeightsRequest, await json_body(request))
    if req.session_id is not None:
        if req.model_seq_id is None:
            raise bad_request('load_weights with session_id also needs model_seq_id')
        rid = svc.training.load_new_model(
            who.name,
            req.session_id,
            req.model_seq_id,
            req.path,
            req.optimizer,
            req.base_model,
            req.user_metadata,
            optimizer_config=None if req.optimizer_config is None else optimizer_family(req.optimizer_config),
        )
        return {'request_id': rid, 'model_id': f'{req.session_id}:train:{req.model_seq_id}'}
    if req.model_id is None:
        raise bad_request('load_weights needs either {session_id, model_seq_id} or {model_id, seq_id}')
    if req.optimizer_config is not None:
        family = optimizer_family(req.optimizer_config)
        current = svc.model(who.name, req.model_id).lora.optimizer
        if family != current:
            raise unprocessable(
                f'model {req.model_id} trains with {current}; optimizer_config ({family}) cannot change the '
                f'optimizer of an existing model'
            )
    rid = svc.training.load_into_model(who.name, req.model_id, req.seq_id, req.path, req.optimizer)
    return {'request_id': rid, 'model_id': req.model_id}


@router.post('/weights_info')
async def weights_info(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    body = await json_body(request)
    path = body.get('tinker_path')
    if not isinstance(path, str):
        raise bad_request('weights_info needs `tinker_path`')
    _, row = svc.checkpoints.checkpoint(who.name, path, readable=True)  # also another tenant's published one
    meta = svc.files.read_meta(row.directory)
    tl = meta.get('tinker_lora', {})
    return {
        'base_model': meta['base_model'],
        'is_lora': True,
        'lora_rank': meta['lora']['rank'],
        'train_unembed': tl.get('train_unembed'),
        'train_mlp': tl.get('train_mlp'),
        'train_attn': tl.get('train_attn'),
    }


Scope = Literal['owned', 'accessible']


@router.get('/training_runs')
async def training_runs(
    limit: int = Query(20, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    access_scope: Scope = Query('owned'),
    who: Tenant = Depends(tenant),
    svc: Service = Depends(service),
) -> dict:
    """The caller's runs (`access_scope=accessible`: and other tenants' runs with a published checkpoint)."""
    runs, total = svc.store.training_runs(who.name, limit, offset, accessible=access_scope == 'accessible')
    return {
        'training_runs': [_run(svc, who.name, r) for r in runs],
        'cursor': {'offset': offset, 'limit': limit, 'total_count': total},
    }


@router.get('/training_runs/{run_id}')
async def training_run(
    run_id: str, access_scope: Scope = Query('owned'), who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    """404 for another tenant's run, unless `access_scope=accessible` and it has a published checkpoint (then
    only its published checkpoints show)."""
    if access_scope == 'accessible':
        row = svc.store.accessible_training_run(run_id, who.name)
    else:
        row = svc.store.training_run(run_id, who.name)
    if row is None:
        raise not_found('training run', run_id)
    return _run(svc, who.name, row)


@router.get('/training_runs/{run_id}/checkpoints')
async def run_checkpoints(run_id: str, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    """A run's checkpoints: all of the caller's own run, or the published ones of another tenant's (404 when it
    has none)."""
    if svc.store.training_run(run_id, who.name) is None:
        public = svc.store.public_checkpoints(run_id)
        if not public:
            raise not_found('training run', run_id)
        return {'checkpoints': [_checkpoint(c) for c in public]}
    pushes = svc.store.pushes(who.name, run_id)
    return {'checkpoints': [_checkpoint(c, pushes) for c in svc.store.checkpoints(who.name, run_id)]}


@router.get('/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/external_weights_urls')
async def external_weights_urls(
    run_id: str, checkpoint_id: str, request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    """`ExternalWeightsUrlsResponse{urls: {file: signed URL}, expires}` for an external_weights/ checkpoint the
    caller may read; each URL is a plain GET on this server (`/api/v1/checkpoint_files/...`), no API key."""
    _checkpoint_id(checkpoint_id)
    urls, expires = await run_in_threadpool(
        svc.checkpoints.download_urls, who.name, run_id, checkpoint_id, str(request.base_url)
    )
    return {'urls': urls, 'expires': _time(expires)}


@router.get(DOWNLOAD_PATH.removeprefix('/api/v1') + '/{file:path}')
async def checkpoint_file(
    file: str,
    run_id: str = Query(..., max_length=1024),
    checkpoint_id: str = Query(..., max_length=1024),
    owner: str = Query(..., max_length=1024),
    reader: str = Query(..., max_length=1024),
    expires: int = Query(..., ge=0, le=MAX_OFFSET),
    sig: str = Query(..., max_length=128),
    svc: Service = Depends(service),
) -> FileResponse:
    """One file of an external-weights checkpoint, by a URL `external_weights_urls` signed (no API key: the
    signature is the credential). 403 for a bad or expired signature; 404 once the checkpoint is deleted, expired
    or -- for another tenant's reader -- unpublished."""
    path = svc.checkpoints.signed_file(file, run_id, checkpoint_id, owner, reader, expires, sig)
    return FileResponse(path, media_type='application/octet-stream', filename=path.name)


@router.post('/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/publish')
async def publish_checkpoint(
    run_id: str, checkpoint_id: str, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    """Make the caller's checkpoint readable by every tenant; 400 when it is public already (the hosted service's
    409 would be retried by the SDK for minutes), 404 for anyone else's."""
    svc.checkpoints.set_public(who.name, run_id, _checkpoint_id(checkpoint_id), True)
    return {}


@router.delete('/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/publish')
async def unpublish_checkpoint(
    run_id: str, checkpoint_id: str, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    """Make the caller's checkpoint private again (other tenants' next requests for it answer 404); 400 when it
    is private already. Registered before the DELETE of a checkpoint, whose path matches too: a checkpoint named
    `publish` (`.../checkpoints/weights/publish`, no `/` left in `checkpoint_id`) is deleted here."""
    if checkpoint_id in SEGMENT_KIND:
        svc.checkpoints.delete_checkpoint(who.name, run_id, f'{checkpoint_id}/publish')
        return {}
    svc.checkpoints.set_public(who.name, run_id, _checkpoint_id(checkpoint_id), False)
    return {}


@router.put('/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/ttl')
async def set_checkpoint_ttl(
    run_id: str, checkpoint_id: str, request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    """`{ttl_seconds}`: the checkpoint expires that long from now (between the server's minimum, one hour by
    default, and 10 years), or never (`null`). Expired checkpoints leave listings at once and are deleted, files
    and all, by the server's sweep."""
    body = await json_body(request)
    if 'ttl_seconds' not in body:
        raise bad_request('set_checkpoint_ttl needs `ttl_seconds` (seconds, or null to remove the expiry)')
    svc.checkpoints.set_ttl(who.name, run_id, _checkpoint_id(checkpoint_id), body['ttl_seconds'])
    return {}


@router.post('/copy_weights')
async def copy_weights(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    """`CopyWeightsRequest` -> `{tinker_path}`: a copy of a checkpoint the caller may read (its own, a published
    one, or one readable by the tenant whose API key is the `weights_access_token`) in a new training run of the
    caller that cannot be trained on, sharing the source's files. `X-Idempotency-Key` makes retries return the
    first copy."""
    req = parse(types.CopyWeightsRequest, await json_body(request))
    key = request.headers.get('x-idempotency-key')
    if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise bad_request(f'X-Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} characters')
    if key is not None:
        done = svc.store.idempotent_result(who.name, f'copy_weights:{key}')
        if done is not None:
            return _copied(done, req.source_path)
    token = req.weights_access_token or request.headers.get('x-tinker-weights-access-token')
    reader = who.name
    if token:
        address = request.client.host if request.client else 'unknown'
        reader = svc.logins.authenticate(svc.store, key_from_headers(token, None), address).name
    path = await run_in_threadpool(
        lambda: svc.copy_weights(
            who.name,
            req.source_path,
            reader=reader,
            session_id=req.session_id,
            model_seq_id=req.model_seq_id,
            project_id=req.destination_project_id,
            ttl_seconds=req.ttl_seconds,
        )
    )
    if key is not None:
        recorded = json.dumps({'source_path': req.source_path, 'tinker_path': path})
        return _copied(svc.store.put_idempotent_result(who.name, f'copy_weights:{key}', recorded), req.source_path)
    return {'tinker_path': path}


def _copied(recorded: str, source_path: str) -> dict:
    done = json.loads(recorded)
    if done['source_path'] != source_path:
        raise unprocessable(
            f'X-Idempotency-Key was used for a copy of {done["source_path"]}, not {source_path}; use a new key'
        )
    return {'tinker_path': done['tinker_path']}


def _checkpoint_id(checkpoint_id: str) -> str:
    if '/' not in checkpoint_id:
        raise unprocessable(
            f'checkpoint_id {checkpoint_id!r} must look like weights/<name>, sampler_weights/<name> or '
            f'external_weights/<name>'
        )
    return checkpoint_id


@router.get('/checkpoints')
async def checkpoints(
    limit: int = Query(100, ge=1, le=10000),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    who: Tenant = Depends(tenant),
    svc: Service = Depends(service),
) -> dict:
    rows, pushes = svc.store.checkpoints(who.name), svc.store.pushes(who.name)
    return {
        'checkpoints': [_checkpoint(c, pushes) for c in rows[offset : offset + limit]],
        'cursor': {'offset': offset, 'limit': limit, 'total_count': len(rows)},
    }


@router.delete('/training_runs/{run_id}/checkpoints/{checkpoint_id:path}')
async def delete_checkpoint(
    run_id: str, checkpoint_id: str, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    svc.checkpoints.delete_checkpoint(who.name, run_id, _checkpoint_id(checkpoint_id))
    return {}


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat()


def _checkpoint(c: CheckpointRow, pushes: dict[tuple[str, str], PushRow] | None = None) -> dict[str, Any]:
    """A Tinker `Checkpoint`; a hub push of it (`service/hub_push.py`) adds `hub_push` and `twinkle.hub_push.*` keys of
    `user_metadata` (the Tinker SDK keeps only the latter)."""
    segment, name = c.checkpoint_id.split('/', 1)
    out = {
        'checkpoint_id': c.checkpoint_id,
        'checkpoint_type': c.kind,
        'time': _time(c.created_at),
        'tinker_path': CheckpointPath(c.run_id, segment, name).uri(),
        'size_bytes': c.size_bytes,
        'public': c.public,
        'user_metadata': c.user_metadata,
        'expires_at': None if c.expires_at is None else _time(c.expires_at),
    }
    push = (pushes or {}).get((c.run_id, c.checkpoint_id))
    if push is not None:
        out['hub_push'] = listing_fields(push)
        out['user_metadata'] = {**(c.user_metadata or {}), **listing_metadata(push)}
    return out


def _run(svc: Service, tenant: str, r: TrainingRunRow) -> dict[str, Any]:
    """A Tinker `TrainingRun`; another tenant's run (published checkpoints) shows only those."""
    if r.tenant == tenant:
        cks, pushes = svc.store.checkpoints(tenant, r.run_id), svc.store.pushes(tenant, r.run_id)
    else:
        cks, pushes = svc.store.public_checkpoints(r.run_id), {}
    last = next((_checkpoint(c, pushes) for c in cks if c.kind == 'training'), None)
    last_sampler = next((_checkpoint(c, pushes) for c in cks if c.kind == 'sampler'), None)
    meta = r.user_metadata if isinstance(r.user_metadata, dict) else None
    return {
        'training_run_id': r.run_id,
        'base_model': r.base_model,
        'model_owner': r.tenant,
        'is_lora': True,
        'corrupted': r.corrupted,
        'lora_rank': r.lora_config['lora']['rank'],
        'last_request_time': _time(r.last_request_time),
        'last_checkpoint': last,
        'last_sampler_checkpoint': last_sampler,
        'user_metadata': {str(k): str(v) for k, v in meta.items()} if meta else None,
    }
