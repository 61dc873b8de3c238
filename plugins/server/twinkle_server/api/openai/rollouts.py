"""Rollout sessions on `/v1` (`service.rollouts`): train an agent that only speaks the OpenAI API, unmodified.

- ``POST /v1/rollouts`` ``{"model", "ttl_s"?, "max_calls"?, "max_tokens"?}`` opens a session; its ``base_url``
  (``/v1/rollouts/{id}/v1``) is an OpenAI base URL: ``…/chat/completions`` there is `/v1/chat/completions`
  recorded in the session (``…/models`` lists the session's model). A plain `/v1/chat/completions` call joins a
  session with the ``X-Rollout-Session`` header or ``"rollout_session"`` in the body.
- ``GET /v1/rollouts/{id}`` the session; ``DELETE`` it; ``POST …/reward`` ``{"reward": x}`` or
  ``{"rewards": [...]}``; ``GET …/episodes`` the recorded episodes as training rows (``input_ids``, ``labels``,
  ``logprobs``, ``reward``, ``calls``, ``segment``) and the session's splits.

Every route is tenant-scoped (another tenant's session is a 404) and answers errors in OpenAI's shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from twinkle_server.api.openai import models as model_names
from twinkle_server.api.openai.rollout_call import SessionCall
from twinkle_server.api.openai.router import OpenAIRoute, _authenticated, _body, chat
from twinkle_server.api.openai.schemas import ChatCompletionRequest, ModelList, _Request
from twinkle_server.store import RolloutRow

router = APIRouter(route_class=OpenAIRoute)
PREFIX = '/v1/rollouts'


class RolloutRequest(_Request):
    model: str
    ttl_s: float | int | None = None
    max_calls: int | None = None
    max_tokens: int | None = None


class RewardRequest(_Request):
    reward: float | int | None = None
    rewards: list[float | int] | None = None


def session_json(row: RolloutRow) -> dict[str, Any]:
    return {
        'id': row.session_id,
        'object': 'rollout_session',
        'model': row.model,
        'created_at': row.created_at,
        'expires_at': row.expires_at,
        'base_url': f'{PREFIX}/{row.session_id}/v1',
        **row.limits,
        'rewards': row.rewards,
    }


@router.post(PREFIX)
async def open_session(request: Request) -> dict[str, Any]:
    svc, who = await _authenticated(request)
    req = await _body(request, svc, RolloutRequest)
    await run_in_threadpool(model_names.resolve, svc, who.name, req.model)  # 404 for a model it cannot sample
    caps = {'ttl_s': req.ttl_s, 'max_calls': req.max_calls, 'max_tokens': req.max_tokens}
    return session_json(await run_in_threadpool(svc.rollouts.create, who.name, req.model, **caps))


@router.get(PREFIX + '/{session_id}')
async def get_session(session_id: str, request: Request) -> dict[str, Any]:
    svc, who = await _authenticated(request)
    return session_json(await run_in_threadpool(svc.rollouts.get, who.name, session_id))


@router.delete(PREFIX + '/{session_id}')
async def delete_session(session_id: str, request: Request) -> dict[str, Any]:
    svc, who = await _authenticated(request)
    await run_in_threadpool(svc.rollouts.delete, who.name, session_id)
    return {'id': session_id, 'object': 'rollout_session', 'deleted': True}


@router.post(PREFIX + '/{session_id}/reward')
async def reward_session(session_id: str, request: Request) -> dict[str, Any]:
    svc, who = await _authenticated(request)
    req = await _body(request, svc, RewardRequest)
    body = req.model_dump(exclude_none=True)
    return await run_in_threadpool(svc.rollouts.reward, who.name, session_id, body)


@router.get(PREFIX + '/{session_id}/episodes')
async def session_episodes(session_id: str, request: Request) -> dict[str, Any]:
    svc, who = await _authenticated(request)
    return await run_in_threadpool(svc.rollouts.episodes, who.name, session_id)


@router.post(PREFIX + '/{session_id}/v1/chat/completions', response_model=None)
async def session_chat(session_id: str, request: Request) -> Response:
    svc, who = await _authenticated(request)
    req = await _body(request, svc, ChatCompletionRequest)
    session = await run_in_threadpool(SessionCall.open, svc, who.name, session_id, req)
    return await chat(request, svc, who, req, session)


@router.get(PREFIX + '/{session_id}/v1/models')
async def session_models(session_id: str, request: Request) -> dict[str, Any]:
    svc, who = await _authenticated(request)
    row = await run_in_threadpool(svc.rollouts.get, who.name, session_id)
    card = await run_in_threadpool(model_names.card, svc, who.name, row.model)
    return ModelList(data=[card]).model_dump(mode='json')
