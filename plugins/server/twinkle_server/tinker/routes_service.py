"""Tinker service routes: client config, sessions, heartbeats, telemetry, capabilities, health."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from tinker import types

from twinkle_server.auth import Tenant
from twinkle_server.deps import json_body, parse, service, tenant
from twinkle_server.errors import ApiError
from twinkle_server.service import Service

router = APIRouter(prefix='/api/v1')


#: share of the body limit the SDK may fill with one forward_backward chunk (its size is an estimate)
CHUNK_SHARE_OF_BODY_LIMIT = 0.75
#: the SDK's own default chunk size (tinker.types.ClientConfigResponse.fwdbwd_max_chunk_bytes_count)
SDK_DEFAULT_CHUNK_BYTES = 5_000_000


@router.post('/client/config')
async def client_config(who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict[str, Any]:
    # Every flag the SDK knows defaults off or to plain HTTP; say so explicitly for the ones that matter. The SDK
    # splits forward_backward into chunks below the body limit (its default, 5 MB, ignores --max-body-mb).
    chunk_bytes = int(svc.config.max_body_bytes * CHUNK_SHARE_OF_BODY_LIMIT)
    return {
        'pjwt_auth_enabled': False,
        'use_pyqwest_transport': False,
        'proto_compress_fwdbwd': False,
        'sample_use_retrieve_futures': False,
        'custom_loss_server_side': False,
        'sample_join_sampling_session': False,
        'parallel_fwdbwd_chunks': True,
        'fwdbwd_max_chunk_bytes_count': min(chunk_bytes, SDK_DEFAULT_CHUNK_BYTES),
    }


@router.post('/client/dynamic_config')
async def client_dynamic_config(who: Tenant = Depends(tenant)) -> dict[str, Any]:
    return {'refresh_interval_sec': 300, 'sample_cancel_enabled': False, 'sample_cancel_max_batch_size': 1}


@router.post('/create_session')
async def create_session(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    req = parse(types.CreateSessionRequest, await json_body(request))
    session_id = f'sess-{uuid.uuid4().hex[:16]}'
    svc.add_session(who.name, session_id, list(req.tags), req.user_metadata)
    return {'session_id': session_id, 'type': 'create_session'}


@router.post('/session_heartbeat')
async def session_heartbeat(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    req = parse(types.SessionHeartbeatRequest, await json_body(request))
    svc.require_session(who.name, req.session_id)  # 404 unknown, 410 finished
    svc.store.touch_session(req.session_id)
    return {'type': 'session_heartbeat'}


@router.post('/sessions/{session_id}/finish')
async def finish_session(session_id: str, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    try:
        svc.finish_session(who.name, session_id)
    except ApiError as exc:
        if exc.status != 410:  # finishing twice is fine
            raise
    return {}


@router.post('/telemetry')
async def telemetry(who: Tenant = Depends(tenant)) -> dict[str, str]:
    return {'status': 'accepted'}


@router.get('/get_server_capabilities')
async def capabilities(who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict[str, Any]:
    return {
        'supported_models': [
            {'model_name': name, 'max_context_length': e.max_context_length, 'trainable': True, 'sampleable': True}
            for name, e in svc.hosts.items()
        ]
    }


@router.get('/healthz')
async def healthz() -> JSONResponse:
    return JSONResponse({'status': 'ok'})
