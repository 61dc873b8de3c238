"""Tinker service routes: client config, sessions (create, heartbeat, finish, list, get, search), joining a
sampling session, telemetry, capabilities, health.

Sessions belong to the tenant that created them: listing, getting and searching show only the caller's own (another
tenant's id answers 404), whatever `access_scope` or `owner` asks for -- tenants of this server are separate
organizations. A session's project is the `project_id` it was created with, or last moved to with
`assign_session_project` (`routes_sessions_extra.py`; `"default"` when none).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from tinker import types

from twinkle_server.api.deps import json_body, parse, service, tenant
from twinkle_server.errors import ApiError, not_found
from twinkle_server.service.auth import Tenant
from twinkle_server.service.core import Service
from twinkle_server.store import SessionRow

router = APIRouter(prefix='/api/v1')
DEFAULT_PROJECT = 'default'
FINISH_REASONS = ('success', 'errored', 'interrupted')
MAX_OFFSET = 2**62  # list offsets are SQL integers (64-bit)

#: The `ClientConfigResponse` feature flags: exactly what this server implements. A flag turns an SDK code path
#: on, so set one True only once its feature is served and tested here (and say which test covers it).
FEATURE_FLAGS: dict[str, bool] = {
    # sampling clients poll /retrieve_futures for their completions (tinker/routes_futures.py;
    # tests/server/test_tinker_parity_routes.py)
    'sample_use_retrieve_futures': True,
    # unpickled SamplingClients ask /join_sampling_session for their client number (below; same test file)
    'sample_join_sampling_session': True,
    # ServiceClient.create_custom_loss uploads the traced loss and forward_backward_custom runs it server-side:
    # /create_custom_loss and loss_fn='custom' (engine/custom_loss/program.py, routes_training.py;
    # tests/server/test_tinker_custom_loss.py)
    'custom_loss_server_side': True,
}
#: The `ClientDynamicConfigResponse` flags (re-read by live clients every `refresh_interval_sec`).
DYNAMIC_FLAGS: dict[str, Any] = {
    'refresh_interval_sec': 300,
    # an abandoned sampling future sends /cancel_future (tinker/routes_futures.py)
    'sample_cancel_enabled': True,
    'sample_cancel_max_batch_size': 64,
}


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
        # transport: plain HTTP/1.1 with API keys, uncompressed protobuf bodies
        'pjwt_auth_enabled': False,
        'use_pyqwest_transport': False,
        'proto_compress_fwdbwd': False,
        'parallel_fwdbwd_chunks': True,
        'fwdbwd_max_chunk_bytes_count': min(chunk_bytes, SDK_DEFAULT_CHUNK_BYTES),
        **FEATURE_FLAGS,
    }


@router.post('/client/dynamic_config')
async def client_dynamic_config(who: Tenant = Depends(tenant)) -> dict[str, Any]:
    return dict(DYNAMIC_FLAGS)


@router.post('/create_session')
async def create_session(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    req = parse(types.CreateSessionRequest, await json_body(request))
    session_id = f'sess-{uuid.uuid4().hex[:16]}'
    svc.add_session(who.name, session_id, list(req.tags), req.user_metadata, req.project_id, req.display_name)
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
async def finish_session(
    session_id: str, request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    """`{reason: {type: success|errored|interrupted}, detail}` (what `ServiceClient.close` sends); the first
    reason reported stays. Finishing twice is fine."""
    body = await json_body(request)
    reason = body.get('reason')
    kind = reason.get('type') if isinstance(reason, dict) else None
    detail = body.get('detail')
    try:
        svc.finish_session(
            who.name,
            session_id,
            kind if kind in FINISH_REASONS else None,
            detail[:4096] if isinstance(detail, str) else None,
        )
    except ApiError as exc:
        if exc.status != 410:  # finishing twice is fine
            raise
    return {}


@router.get('/sessions')
async def list_sessions(
    limit: int = Query(20, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    access_scope: Literal['owned', 'accessible'] = Query('owned'),
    who: Tenant = Depends(tenant),
    svc: Service = Depends(service),
) -> dict[str, Any]:
    """`ListSessionsResponse{sessions: [session_id]}`: the caller's sessions, newest first."""
    return {'sessions': svc.store.session_ids(who.name, limit, offset)}


@router.post('/sessions/search')
async def search_sessions(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    """`SessionSearchRequest` -> `SessionSearchResponse{sessions: [SessionSummary], next_cursor}`, newest first."""
    req = parse(types.SessionSearchRequest, await json_body(request))
    owner = req.owner
    if isinstance(owner, types.UserSearchOwner) and who.name not in owner.owner_urns:
        return {'sessions': [], 'next_cursor': None}  # other tenants' sessions are never visible
    now = time.time()
    rows = [r for r in svc.store.sessions(who.name) if _matches(req, r, _status(r, now, svc))]
    rows.sort(key=lambda r: (_time(r.created_at), r.session_id), reverse=True)
    if req.cursor is not None:
        after = (req.cursor.last_created_at, req.cursor.last_session_id)
        rows = [r for r in rows if (_time(r.created_at), r.session_id) < after]
    page = rows[: req.limit]
    stats = svc.store.session_checkpoint_stats(who.name)
    summaries = []
    for r in page:
        count, size = stats.get(r.session_id, (0, 0))
        summaries.append(
            {
                'session_id': r.session_id,
                'created_at': _time(r.created_at).isoformat(),
                'owner': r.tenant,
                'project_id': r.project_id or DEFAULT_PROJECT,
                'status': _status(r, now, svc),
                'checkpoints_count': count,
                'display_name': r.display_name,
                'user_metadata': _str_dict(r.user_metadata),
                'checkpoint_storage_bytes': size,
            }
        )
    more = len(rows) > len(page)
    last = page[-1] if page else None
    cursor = (
        {'last_created_at': _time(last.created_at).isoformat(), 'last_session_id': last.session_id}
        if more and last is not None
        else None
    )
    return {'sessions': summaries, 'next_cursor': cursor}


@router.get('/sessions/{session_id}')
async def get_session(
    session_id: str,
    access_scope: Literal['owned', 'accessible'] = Query('owned'),
    who: Tenant = Depends(tenant),
    svc: Service = Depends(service),
) -> dict[str, Any]:
    """`GetSessionResponse{training_run_ids, sampler_ids, user_metadata, display_name}`; 404 for another
    tenant's session."""
    row = svc.store.session(session_id, who.name)
    if row is None:
        raise not_found('session', session_id)
    runs, samplers = svc.store.session_members(session_id, who.name)
    return {
        'training_run_ids': runs,
        'sampler_ids': samplers,
        'user_metadata': _str_dict(row.user_metadata),
        'display_name': row.display_name,
    }


@router.post('/join_sampling_session')
async def join_sampling_session(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    """`{sampling_session_id}` -> `{client_counter}`: a number unique among the sampling session's clients (the
    creating client is 0); an unpickled SamplingClient numbers its requests from `client_counter * 10**9`."""
    req = parse(types.JoinSamplingSessionRequest, await json_body(request))
    counter = svc.sampling.join_sampling_session(who.name, req.sampling_session_id)
    return {'type': 'join_sampling_session', 'client_counter': counter}


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


def _time(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def _str_dict(value: Any) -> dict[str, str] | None:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None


def _status(r: SessionRow, now: float, svc: Service) -> dict[str, Any] | None:
    """A `SessionStatus`: finished by its client (with the reason it gave), active (heart-beating), or None
    (neither: it stopped heart-beating, or finished without a reason)."""
    if r.finished:
        if r.finish_reason in FINISH_REASONS:
            return {'type': 'client_finished', 'reason': {'type': r.finish_reason}, 'detail': r.finish_detail}
        return None
    return {'type': 'active'} if r.last_seen >= now - svc.config.session_ttl_s else None


def _matches(req: types.SessionSearchRequest, r: SessionRow, status: dict[str, Any] | None) -> bool:
    if req.session_id is not None or req.display_name is not None:
        by_id = req.session_id is not None and r.session_id == req.session_id
        name = (r.display_name or '').lower()
        by_name = req.display_name is not None and all(w in name for w in req.display_name.lower().split())
        if not (by_id or by_name):
            return False
    if req.project_ids is not None and (r.project_id or DEFAULT_PROJECT) not in req.project_ids:
        return False
    meta = _str_dict(r.user_metadata) or {}
    if any(meta.get(k) != v for k, v in req.user_metadata.items()):
        return False
    if req.statuses is not None:
        return any(_status_matches(q, status) for q in req.statuses)
    return True


def _status_matches(query: Any, status: dict[str, Any] | None) -> bool:
    if status is None or query.type != status['type']:
        return False
    if isinstance(query, types.ClientFinishedSessionStatusQuery) and query.reasons is not None:
        return status['reason']['type'] in query.reasons
    return True
