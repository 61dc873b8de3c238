"""Tinker session routes beyond `routes_service`: moving a session into a project
(`RestClient.assign_session_project`) and exporting its trace (`RestClient.export_session_trace`).

A project is a name within the tenant (there are no project ACLs: a tenant may use any project name), so moving a
session never answers 403; another tenant's session answers 404. The session's runs and sampling sessions follow
it (they are found by session). `search_sessions` shows the new `project_id` at once, and it is stored, so it
survives a restart.

The trace export is ready at once: the poll answers `{status: "ready", url}`, and the URL (plain GET, no API
key, valid one hour) builds the trace when fetched (`tinker/session_trace.py`), so it always shows the newest
state.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from twinkle_server.api.deps import json_body, service, tenant
from twinkle_server.api.tinker.routes_service import MAX_OFFSET
from twinkle_server.api.tinker.session_trace import TRACE_PATH, build_trace, trace_url, verify
from twinkle_server.errors import bad_request, not_found
from twinkle_server.service.auth import Tenant
from twinkle_server.service.core import Service

router = APIRouter(prefix='/api/v1')
MAX_PROJECT_ID = 256


@router.put('/sessions/{session_id}/project')
async def assign_session_project(
    session_id: str, request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    """`{project_id}`: move the caller's session (finished or not) into that project; 400 without a project
    (clearing it is not supported, as on the hosted service) or for a bad one, 404 for another tenant's session."""
    project_id = (await json_body(request)).get('project_id')
    if not isinstance(project_id, str) or not project_id.strip():
        raise bad_request('project_id is required: a non-empty string (a session cannot be moved out of a project)')
    if len(project_id) > MAX_PROJECT_ID or any(ord(c) < 32 or ord(c) == 127 for c in project_id):
        raise bad_request(f'project_id must be at most {MAX_PROJECT_ID} characters, without control characters')
    if svc.store.session(session_id, who.name) is None:
        raise not_found('session', session_id)
    svc.store.set_session_project(session_id, who.name, project_id)
    return {}


@router.get('/sessions/{session_id}/trace_export')
async def trace_export(
    session_id: str, request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    """The SDK's trace-export poll: `{status: "ready", url, error: null}` for the caller's session, 404 for
    anyone else's."""
    if svc.store.session(session_id, who.name) is None:
        raise not_found('session', session_id)
    url = trace_url(svc.store, who.name, session_id, str(request.base_url))
    return {'status': 'ready', 'url': url, 'error': None}


@router.get(TRACE_PATH.removeprefix('/api/v1') + '/{session_id}')
async def session_trace(
    session_id: str,
    owner: str = Query(..., max_length=1024),
    expires: int = Query(..., ge=0, le=MAX_OFFSET),
    sig: str = Query(..., max_length=128),
    svc: Service = Depends(service),
) -> Response:
    """The trace a `trace_export` URL signed (no API key: the signature is the credential); 403 for a bad or
    expired signature."""
    verify(svc.store, owner, session_id, expires, sig)
    trace = await run_in_threadpool(build_trace, svc.store, owner, session_id)
    filename = re.sub(r'[^A-Za-z0-9._-]', '_', session_id)
    return Response(
        json.dumps(trace, separators=(',', ':')).encode(),
        media_type='application/json',
        headers={'Content-Disposition': f'attachment; filename="{filename}.trace.json"'},
    )
