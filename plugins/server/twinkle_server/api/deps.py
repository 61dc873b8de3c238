"""FastAPI dependencies shared by every route: the service, the authenticated tenant, JSON bodies."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from twinkle_server import logs
from twinkle_server.errors import bad_request
from twinkle_server.service.auth import Tenant, key_from_headers
from twinkle_server.service.core import Service

M = TypeVar('M', bound=BaseModel)


def service(request: Request) -> Service:
    return request.app.state.service


def tenant(request: Request) -> Tenant:
    """Authenticate `X-API-Key` (or `Authorization: Bearer`), throttle failed logins (`auth.LoginThrottle`: per
    client address and key id; the address a trusted proxy forwarded, see `launch.py`) and apply the
    tenant's request-rate limit. The tenant is recorded on the request (`request.state.tenant`: the request
    guard frees a rejected request's seq_id only for the model's own tenant) and in its log context."""
    key = key_from_headers(request.headers.get('x-api-key'), request.headers.get('authorization'))
    svc = service(request)
    address = request.client.host if request.client else 'unknown'
    who = svc.logins.authenticate(svc.store, key, address)
    request.state.tenant = who.name
    logs.annotate(tenant=who.name)
    svc.quotas.check_rate(who.name)
    return who


def load_json(raw: bytes) -> Any:
    """Parse a JSON body; a 400 for anything that is not JSON (including nesting too deep to parse)."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f'request body is not valid JSON: {exc}') from None
    except RecursionError:
        raise bad_request('request body is nested too deeply to parse') from None


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    body = load_json(raw)
    if not isinstance(body, dict):
        raise bad_request(f'request body must be a JSON object, got {type(body).__name__}')
    return body


def parse(model: type[M], body: dict[str, Any]) -> M:
    """Validate `body` against an SDK request model; a 400 lists every bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = '; '.join(f'{".".join(str(p) for p in e["loc"]) or "body"}: {e["msg"]}' for e in exc.errors())
        raise bad_request(f'invalid {model.__name__}: {problems}') from None
    except RecursionError:
        raise bad_request(f'invalid {model.__name__}: nested too deeply') from None
