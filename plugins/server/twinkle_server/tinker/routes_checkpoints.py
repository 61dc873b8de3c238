"""Tinker checkpoint routes: save/load weights, sampler weights, weights_info, run and checkpoint listings.

A refused request frees its seq_id through the request guard (`guard.py`); routes just raise.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from tinker import types

from twinkle_server.auth import Tenant
from twinkle_server.checkpoints import CheckpointPath
from twinkle_server.deps import json_body, parse, service, tenant
from twinkle_server.errors import bad_request, not_found, unprocessable
from twinkle_server.hub_push import listing_fields, listing_metadata
from twinkle_server.service import Service
from twinkle_server.store import CheckpointRow, PushRow, TrainingRunRow

router = APIRouter(prefix='/api/v1')
MAX_OFFSET = 2**62  # list offsets are SQL integers (64-bit)


@router.post('/save_weights')
async def save_weights(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    req = parse(types.SaveWeightsRequest, await json_body(request))
    if not req.path:
        raise bad_request('save_weights needs a checkpoint name in `path`')
    rid = svc.checkpoints.save(
        who.name,
        req.model_id,
        req.seq_id,
        req.path,
        sampler=False,
        optimizer=True,
        overwrite=True,
        user_metadata=req.user_metadata,
    )
    return {'request_id': rid, 'model_id': req.model_id}


@router.post('/save_weights_for_sampler')
async def save_weights_for_sampler(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    req = parse(types.SaveWeightsForSamplerRequest, await json_body(request))
    if req.path:
        rid = svc.checkpoints.save(
            who.name,
            req.model_id,
            req.seq_id,
            req.path,
            sampler=True,
            optimizer=False,
            user_metadata=req.user_metadata,
            post=lambda uri: {'path': uri, 'type': 'save_weights_for_sampler'},
        )
    elif req.sampling_session_seq_id is not None:
        session_id = req.model_id.split(':train:')[0]
        rid = svc.checkpoints.save_for_new_sampler(
            who.name, req.model_id, req.seq_id, session_id, req.sampling_session_seq_id
        )
    else:
        raise bad_request('save_weights_for_sampler needs `path` (a name) or `sampling_session_seq_id`')
    return {'request_id': rid, 'model_id': req.model_id}


@router.post('/load_weights')
async def load_weights(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    req = parse(types.LoadWeightsRequest, await json_body(request))
    if req.session_id is not None:
        if req.model_seq_id is None:
            raise bad_request('load_weights with session_id also needs model_seq_id')
        rid = svc.load_new_model(
            who.name, req.session_id, req.model_seq_id, req.path, req.optimizer, req.base_model, req.user_metadata
        )
        return {'request_id': rid, 'model_id': f'{req.session_id}:train:{req.model_seq_id}'}
    if req.model_id is None:
        raise bad_request('load_weights needs either {session_id, model_seq_id} or {model_id, seq_id}')
    rid = svc.load_into_model(who.name, req.model_id, req.seq_id, req.path, req.optimizer)
    return {'request_id': rid, 'model_id': req.model_id}


@router.post('/weights_info')
async def weights_info(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    body = await json_body(request)
    path = body.get('tinker_path')
    if not isinstance(path, str):
        raise bad_request('weights_info needs `tinker_path`')
    _, row = svc.checkpoints.checkpoint(who.name, path)
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


@router.get('/training_runs')
async def training_runs(
    limit: int = Query(20, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    who: Tenant = Depends(tenant),
    svc: Service = Depends(service),
) -> dict:
    runs, total = svc.store.training_runs(who.name, limit, offset)
    return {
        'training_runs': [_run(svc, who.name, r) for r in runs],
        'cursor': {'offset': offset, 'limit': limit, 'total_count': total},
    }


@router.get('/training_runs/{run_id}')
async def training_run(run_id: str, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    row = svc.store.training_run(run_id, who.name)
    if row is None:
        raise not_found('training run', run_id)
    return _run(svc, who.name, row)


@router.get('/training_runs/{run_id}/checkpoints')
async def run_checkpoints(run_id: str, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    if svc.store.training_run(run_id, who.name) is None:
        raise not_found('training run', run_id)
    pushes = svc.store.pushes(who.name, run_id)
    return {'checkpoints': [_checkpoint(c, pushes) for c in svc.store.checkpoints(who.name, run_id)]}


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
    if '/' not in checkpoint_id:
        raise unprocessable(f'checkpoint_id {checkpoint_id!r} must look like weights/<name> or sampler_weights/<name>')
    svc.checkpoints.delete_checkpoint(who.name, run_id, checkpoint_id)
    return {}


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat()


def _checkpoint(c: CheckpointRow, pushes: dict[tuple[str, str], PushRow] | None = None) -> dict[str, Any]:
    """A Tinker `Checkpoint`; a hub push of it (`hub_push.py`) adds `hub_push` and `twinkle.hub_push.*` keys of
    `user_metadata` (the Tinker SDK keeps only the latter)."""
    segment, name = c.checkpoint_id.split('/', 1)
    out = {
        'checkpoint_id': c.checkpoint_id,
        'checkpoint_type': c.kind,
        'time': _time(c.created_at),
        'tinker_path': CheckpointPath(c.run_id, segment, name).uri(),
        'size_bytes': c.size_bytes,
        'public': False,
        'user_metadata': c.user_metadata,
    }
    push = (pushes or {}).get((c.run_id, c.checkpoint_id))
    if push is not None:
        out['hub_push'] = listing_fields(push)
        out['user_metadata'] = {**(c.user_metadata or {}), **listing_metadata(push)}
    return out


def _run(svc: Service, tenant: str, r: TrainingRunRow) -> dict[str, Any]:
    cks, pushes = svc.store.checkpoints(tenant, r.run_id), svc.store.pushes(tenant, r.run_id)
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
