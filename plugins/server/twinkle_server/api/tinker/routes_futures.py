"""Futures: `retrieve_future` (long-poll one queued request's result: JSON, or protobuf bytes for training and
sampling), `retrieve_futures` (long-poll a sampling-session client's completions) and `cancel_future` (stop a
sampling request).

`retrieve_futures` is what SDK clients use for sampling when `/client/config` says `sample_use_retrieve_futures`:
one poll per (sampling session, client) reports which of its requests finished or failed; the client then fetches
each result with `retrieve_future`. Every answer carries a cursor; a poll acknowledges the answers up to its
`prev_cursor`, so a completion is reported again only when the answer that carried it was lost.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from tinker import types

from twinkle_server.api.deps import json_body, parse, service, tenant
from twinkle_server.errors import bad_request, not_found
from twinkle_server.service.auth import Tenant
from twinkle_server.service.core import Service, sampling_target

router = APIRouter(prefix='/api/v1')
MAX_CURSOR = 2**62  # cursors are SQL integers (64-bit)


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


@router.post('/retrieve_futures')
async def retrieve_futures(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    """`FuturesRetrieveRequest` -> `FuturesRetrieveResponse{completions: [{state: finished|failed, request_id,
    response_payload_uncompressed_size?}], cursor}`; waits up to `timeout` (default and at most the server's
    long poll) for a completion when there is none yet. 404 for a sampling session the caller does not own."""
    req = parse(types.FuturesRetrieveRequest, await json_body(request))
    target = req.target
    if not 0 <= req.prev_cursor <= MAX_CURSOR:
        raise bad_request(f'prev_cursor must be an integer from 0 to {MAX_CURSOR}, got {req.prev_cursor}')
    if not 0 <= target.cloned_sampler_id <= MAX_CURSOR:
        raise bad_request(f'cloned_sampler_id must be an integer >= 0, got {target.cloned_sampler_id}')
    if svc.store.sampling_session(target.sampling_session_id, who.name) is None:
        raise not_found('sampling session', target.sampling_session_id)
    timeout = svc.config.long_poll_s
    if req.timeout is not None:
        if req.timeout != req.timeout or req.timeout < 0:  # NaN or negative
            raise bad_request(f'timeout must be a number of seconds >= 0, got {req.timeout}')
        timeout = min(req.timeout, timeout)
    found, cursor = await svc.futures.completions(
        who.name,
        sampling_target(target.sampling_session_id, target.cloned_sampler_id),
        req.prev_cursor,
        timeout,
    )
    completions: list[dict[str, Any]] = []
    for request_id, state, size in found:
        if state == 'done':
            completions.append(
                {'state': 'finished', 'request_id': request_id, 'response_payload_uncompressed_size': size}
            )
        else:
            completions.append({'state': 'failed', 'request_id': request_id})
    return {'completions': completions, 'cursor': cursor}


@router.post('/cancel_future')
async def cancel_future(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    """`{request_id}` of a sampling request: dropped if still queued, answered at once if running (its future then
    fails with `category: user`, "... was cancelled"); a finished one is left as it is. 404 for another tenant's
    id, 400 for a request that is not sampling."""
    body = await json_body(request)
    request_id = body.get('request_id')
    if not isinstance(request_id, str) or not request_id:
        raise bad_request('cancel_future needs `request_id` (a string)')
    svc.sampling.cancel_future(who.name, request_id)
    return {}
