"""`retrieve_future`: long-poll a queued request's result (JSON, or protobuf bytes for training/sampling)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from twinkle_server.auth import Tenant
from twinkle_server.deps import json_body, service, tenant
from twinkle_server.errors import bad_request, not_found
from twinkle_server.service import Service

router = APIRouter(prefix='/api/v1')


@router.post('/retrieve_future')
async def retrieve_future(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> Response:
    body = await json_body(request)
    request_id = body.get('request_id')
    if not isinstance(request_id, str):
        raise bad_request('retrieve_future needs `request_id`')
    row = await svc.futures.wait(request_id, who.name, svc.config.long_poll_s)
    if row is None:
        raise not_found('request', request_id)
    if row.state == 'pending':
        return JSONResponse({'type': 'try_again', 'request_id': request_id, 'queue_state': 'active'})
    return Response(content=row.body, media_type=row.content_type)
