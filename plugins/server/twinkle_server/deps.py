"""FastAPI dependencies shared by every route: the service, the authenticated tenant, JSON bodies."""
from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from twinkle_server.auth import Tenant, authenticate
from twinkle_server.errors import bad_request
from twinkle_server.service import Service

M = TypeVar('M', bound=BaseModel)


def service(request: Request) -> Service:
    return request.app.state.service


def tenant(request: Request) -> Tenant:
    """Authenticate `X-API-Key` (or `Authorization: Bearer`) and apply the tenant's request-rate limit."""
    key = request.headers.get('x-api-key')
    if key is None and request.headers.get('authorization', '').lower().startswith('bearer '):
        key = request.headers['authorization'][7:]
    svc = service(request)
    who = authenticate(svc.store, key)
    svc.check_rate(who.name)
    return who


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f'request body is not valid JSON: {exc}') from None
    if not isinstance(body, dict):
        raise bad_request(f'request body must be a JSON object, got {type(body).__name__}')
    return body


def parse(model: type[M], body: dict[str, Any]) -> M:
    """Validate `body` against an SDK request model; a 400 lists every bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = '; '.join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        raise bad_request(f'invalid {model.__name__}: {problems}') from None
