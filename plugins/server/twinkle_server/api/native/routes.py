"""Native API: remote `Model` / `Sampler` method calls, whitelisted from the interface declarations.

    POST /twinkle/v1/models                          {base_model, config, seed?, gradient_accumulation_steps?}
                                                                                        -> {model_id}
    POST /twinkle/v1/models/load                     {path, load_optimizer}             -> {model_id, base_model}
    POST /twinkle/v1/models/{model_id}/call/{method} {args: [...], kwargs: {...}}       -> {result}
    POST /twinkle/v1/samplers                        {base_model}                       -> {sampler_id}
    POST /twinkle/v1/samplers/{id}/call/{method}     {args, kwargs}                     -> {result}

Callable methods are exactly `remote_methods(Model)` / `remote_methods(Sampler)` (twinkle_core.dispatch); the
server supplies `adapter_name` (a tenant only ever touches its own adapter). `save` / `load` go through the
service's checkpoint store (`twinkle://` paths, atomic, tenant-scoped). Component names in arguments must be
registered names: hub references (`ms://`, `hf://`) named by a client are refused (docs/hub.md: code from the
hub runs only when the operator pinned or trusted it), and a file path in an argument (e.g. `set_template`'s
`model_id_or_tokenizer`) -- a path form, or a bare name that exists relative to the server's working directory --
must resolve inside the hosted model's own directory or a root the operator allow-listed (`native.paths`).
Calls are synchronous: the route waits for the queued work (it still runs on the model's worker thread, in
order, fairly scheduled with every other tenant).
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request

from twinkle_core.dispatch import remote_methods
from twinkle_core.errors import InvalidInputError
from twinkle_core.model.base import Model
from twinkle_core.sampler.base import Sampler
from twinkle_core.types import SamplingParams
from twinkle_core.utils.arrays import unpack_arrays
from twinkle_core.utils.json import to_json
from twinkle_server.api.deps import json_body, parse, service, tenant
from twinkle_server.api.native.paths import refuse_foreign_paths, refuse_hub_refs, roots_of
from twinkle_server.engine.model_host.base import ALL_LINEAR, LoraSpec, SampleJob
from twinkle_server.errors import ApiError, bad_request, not_found, unprocessable
from twinkle_server.service.auth import Tenant
from twinkle_server.service.core import Service

router = APIRouter(prefix='/twinkle/v1')

# the server manages adapters: a tenant neither adds, removes nor lists them (list_adapters would show other
# tenants')
MODEL_METHODS = frozenset(remote_methods(Model)) - {'add_adapter_to_model', 'list_adapters', 'remove_adapter'}
SAMPLER_METHODS = frozenset(remote_methods(Sampler))
_CHECKPOINT_METHODS = {'save', 'load'}
OUTSIDE = (
    "native calls may only name files inside the hosted model's directory or a root the operator allowed "
    '(--allow-path); use a registered component name'
)


@router.post('/models')
async def create_model(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    body = await json_body(request)
    config = body.get('config') or {}
    if not isinstance(config, dict):
        raise bad_request('config must be a JSON object of LoRA fields (r, lora_alpha, target_modules, ...)')
    lora = _lora_spec(config, body.get('seed'), body.get('gradient_accumulation_steps', 1))
    session_id = _native_session(svc, who.name)
    rid = svc.training.create_model(
        who.name,
        session_id,
        0,
        svc.hosted_name(str(body.get('base_model', ''))),
        {'rank': lora.rank, 'seed': lora.seed},
        lora=lora,
    )
    result = await _wait(svc, who.name, rid)
    return {'model_id': result['model_id']}


@router.post('/models/load')
async def load_model(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    body = await json_body(request)
    session_id = _native_session(svc, who.name)
    rid = svc.training.load_new_model(
        who.name, session_id, 0, str(body.get('path', '')), bool(body.get('load_optimizer'))
    )
    result = await _wait(svc, who.name, rid)
    return {'model_id': result['model_id'], 'base_model': svc.models[result['model_id']].base_model}


@router.post('/models/{model_id}/call/{method}')
async def call_model(
    model_id: str, method: str, request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    if method not in MODEL_METHODS:
        raise ApiError(404, f'{method!r} is not a remote Model method; callable: {sorted(MODEL_METHODS)}')
    args, kwargs = _call_args(await json_body(request))
    kwargs.pop('adapter_name', None)  # the server decides: the model's own adapter
    svc.model(who.name, model_id)
    svc.store.touch_session(model_id.split(':train:')[0])
    if method == 'save':
        name, save_optimizer, hub_push = _save_args(args, kwargs)
        rid = svc.checkpoints.save(
            who.name,
            model_id,
            None,
            name,
            sampler=False,
            optimizer=save_optimizer,
            post=lambda uri: {'result': uri},
            scheme='twinkle://',
            hub_push=hub_push,
        )  # per-request opt-in (docs/server.md)
        return await _wait(svc, who.name, rid)
    if method == 'load':
        path = args[0] if args else kwargs.pop('path', None)
        rid = svc.training.load_into_model(
            who.name, model_id, None, str(path or ''), bool(kwargs.get('load_optimizer'))
        )
        await _wait(svc, who.name, rid)
        return {'result': None}
    refuse_hub_refs(args, kwargs)
    refuse_foreign_paths(_roots(svc, model_id), OUTSIDE, args, kwargs)
    rid = svc.training.call(
        who.name, model_id, lambda e: {'result': to_json(e.native_call(model_id, method, args, kwargs))}
    )
    return await _wait(svc, who.name, rid)


@router.post('/samplers')
async def create_sampler(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    body = await json_body(request)
    base, path = body.get('base_model'), body.get('model_path')
    if not isinstance(base, (str, type(None))) or not isinstance(path, (str, type(None))):
        raise bad_request('a sampler body is {"base_model": NAME} or {"model_path": "twinkle://..."} (strings)')
    session_id = _native_session(svc, who.name)
    sid = svc.sampling.create_sampling_session(who.name, session_id, 0, path, svc.hosted_name(base) if base else None)
    return {'sampler_id': sid}


@router.post('/samplers/{sampler_id}/call/{method}')
async def call_sampler(
    sampler_id: str, method: str, request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict:
    if method not in SAMPLER_METHODS:
        raise ApiError(404, f'{method!r} is not a remote Sampler method; callable: {sorted(SAMPLER_METHODS)}')
    row = svc.store.sampling_session(sampler_id, who.name)
    if row is None:
        raise not_found('sampler', sampler_id)
    if method != 'sample':
        raise unprocessable(
            f'{method} is managed by the server: sample from a checkpoint by passing its twinkle:// '
            f'path as adapter_name'
        )
    args, kwargs = _call_args(await json_body(request))
    inputs = args[0] if args else kwargs.pop('inputs', None)
    params = parse(SamplingParams, args[1] if len(args) > 1 else kwargs.pop('sampling_params', None) or {})
    adapter = kwargs.pop('adapter_name', None)
    prompts = inputs if isinstance(inputs, list) else [inputs]
    adapters = adapter if isinstance(adapter, list) else [adapter] * len(prompts)
    rids = []
    for prompt, path in zip(prompts, adapters):
        ids = prompt.get('input_ids') if isinstance(prompt, dict) else prompt
        if not isinstance(ids, list) or not ids:
            raise unprocessable(
                'native sample takes prompts as token ids (InputFeature rows with input_ids); '
                'encode chat prompts client-side with a template'
            )
        if isinstance(prompt, dict) and prompt.get('pixel_values') is not None:
            raise unprocessable(
                'native sample takes text prompts only; sample image prompts through the Tinker '
                'API (asample with ImageChunks: the server sizes and encodes the images itself)'
            )
        job = SampleJob(list(ids), params, params.num_samples, params.prompt_logprobs)
        rids.append(
            svc.sampling.sample(
                who.name,
                svc.sampling.resolve_target(
                    who.name, None if path else sampler_id, path or None, row.base_model if path else None
                ),
                job,
                post=lambda r: r.model_dump(),
            )
        )
    return {'result': [await _wait(svc, who.name, rid) for rid in rids]}


# ---- helpers ---------------------------------------------------------------------------------------------------
def _native_session(svc: Service, tenant_name: str) -> str:
    session_id = f'native-{uuid.uuid4().hex[:16]}'
    svc.add_session(tenant_name, session_id, ['native'], None)
    return session_id


def _lora_spec(config: dict[str, Any], seed: Any, accumulation: Any = 1) -> LoraSpec:
    """The adapter exactly as the client asked for it (peft defaults for what it left out: lora_alpha=8,
    target_modules='all-linear'); other LoraConfig fields travel along and are validated by the backend."""
    options = dict(config)
    rank = options.pop('r', options.pop('rank', 8))
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise bad_request(f'config.r must be an integer >= 1, got {rank!r}')
    alpha = options.pop('lora_alpha', 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise bad_request(f'config.lora_alpha must be a positive number, got {alpha!r}')
    targets = options.pop('target_modules', ALL_LINEAR)
    targets = (targets,) if isinstance(targets, str) else targets
    if not isinstance(targets, list | tuple) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise bad_request(f'config.target_modules must be "all-linear" or a list of module names, got {targets!r}')
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad_request(f'seed must be an integer, got {seed!r}')
    if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
        raise bad_request(f'gradient_accumulation_steps must be an integer >= 1, got {accumulation!r}')
    return LoraSpec(rank, float(alpha), tuple(targets), seed, options, accumulation)


#: the keyword arguments of a remote `save` (adapter_name is the model's own; the server chooses the directory)
SAVE_KWARGS = ('name', 'save_optimizer', 'hub_push')


def _save_args(args: list[Any], kwargs: dict[str, Any]) -> tuple[str, bool, bool]:
    """(name, save_optimizer, hub_push) of a remote `save(name, *, save_optimizer=False, hub_push=False)`; a 400
    naming any other argument (e.g. output_dir, or a hub token the server would otherwise silently ignore)."""
    unknown = sorted(set(kwargs) - set(SAVE_KWARGS))
    if unknown:
        raise bad_request(
            f'save: unknown keyword argument(s) {", ".join(unknown)}; a remote save accepts '
            f'{", ".join(SAVE_KWARGS)} (the server chooses where checkpoints are written)'
        )
    if len(args) > 1 or (args and 'name' in kwargs):
        raise bad_request('save takes one positional argument, the checkpoint name')
    name = args[0] if args else kwargs.get('name')
    if not isinstance(name, str):
        raise bad_request(f'save needs a checkpoint name (a string), got {name!r}')
    flags = {key: kwargs.get(key, False) for key in ('save_optimizer', 'hub_push')}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise bad_request(f'save: {key} must be true or false, got {value!r}')
    return name, flags['save_optimizer'], flags['hub_push']


def _call_args(body: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """`args` and `kwargs` of a call body, with packed float arrays (`twinkle_core.utils.arrays`) unpacked."""
    args, kwargs = body.get('args', []), body.get('kwargs', {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise bad_request('a call body is {"args": [...], "kwargs": {...}}')
    try:
        return unpack_arrays(args, 'args'), unpack_arrays(kwargs, 'kwargs')
    except InvalidInputError as exc:
        raise bad_request(str(exc)) from None


def _roots(svc: Service, model_id: str) -> list[Path]:
    """Where a native call's file paths may lie: the hosted model's directory and the allowed roots."""
    return roots_of(svc.host(svc.models[model_id].base_model).model_dir, *svc.config.allowed_roots)


async def _wait(svc: Service, tenant_name: str, request_id: str) -> Any:
    while True:
        row = await svc.futures.wait(request_id, tenant_name, 300.0)
        if row is None:
            raise not_found('request', request_id)
        if row.state == 'pending':
            continue
        body = json.loads(row.body or b'null')
        if row.state == 'failed':
            status = body.get('status') or (422 if body.get('category') == 'user' else 500)
            raise ApiError(int(status), body.get('error', 'failed'))
        return body
