"""Tinker training routes: create_model, get_info, create_custom_loss, forward_backward (protobuf), optim_step,
unload_model.

A refused request frees its seq_id through the request guard (`api/guard.py`); routes just raise.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool
from tinker import types

from twinkle_server.api.deps import json_body, parse, service, tenant
from twinkle_server.api.tinker import custom_loss_admit, datums, losses, optimizers, stability, wire
from twinkle_server.engine.custom_loss.program import CustomLossSpec, GraphError
from twinkle_server.engine.model_host.base import TrainBatch, TrainResult
from twinkle_server.errors import ApiError, bad_request, not_found, unprocessable
from twinkle_server.service import images
from twinkle_server.service.auth import Tenant
from twinkle_server.service.core import Service
from twinkle_server.service.training import train_metrics

router = APIRouter(prefix='/api/v1')


@router.post('/create_model')
async def create_model(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    req = parse(types.CreateModelRequest, await json_body(request))
    if req.lora_config is None:
        raise ApiError(422, 'full fine-tuning is not offered by this server; pass a lora_config (rank >= 1)')
    rid = svc.training.create_model(
        who.name,
        req.session_id,
        req.model_seq_id,
        req.base_model,
        req.lora_config.model_dump(),
        req.user_metadata,
        optimizer=optimizers.optimizer_family(req.optimizer_config),
    )
    return {'request_id': rid, 'model_id': f'{req.session_id}:train:{req.model_seq_id}'}


@router.post('/get_info')
async def get_info(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    req = parse(types.GetInfoRequest, await json_body(request))
    m = svc.model(who.name, req.model_id)
    host = svc.host(m.base_model)
    return {
        'type': 'get_info',
        'model_id': m.model_id,
        'is_lora': True,
        'lora_rank': m.lora.rank,
        'model_name': m.base_model,
        'model_data': {'arch': 'causal_lm', 'model_name': m.base_model, 'tokenizer_id': host.model_dir},
    }


@router.post('/create_custom_loss')
async def create_custom_loss(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    """`CreateCustomLossRequest` -> future of `{loss_id}`: the traced graph, validated node by node
    (`engine.custom_loss.program`; a 422 naming the bad input or node) and priced at the full context of the hosted
    models (a 422 naming the costliest node when it fits no model's budget; `tinker.custom_loss_admit`), kept for
    the session (in memory). A tenant throttled for a loss that ran past its time budget gets a 429."""
    req = parse(types.CreateCustomLossRequest, await json_body(request))
    svc.require_session(who.name, req.session_id)  # 404 unknown or another tenant's, 410 finished
    custom_loss_admit.check_tenant(who.name)
    try:
        spec = await run_in_threadpool(
            CustomLossSpec.validate,
            req.name,
            [i.model_dump() for i in req.inputs],
            [n.model_dump() for n in req.graph.nodes],
        )
        custom_loss_admit.check_tenant(who.name, spec)
        await run_in_threadpool(custom_loss_admit.check_cost, svc.config, svc.hosts, spec)
        loss_id = svc.custom_losses.add(who.name, req.session_id, req.custom_loss_seq_id, spec)
    except GraphError as exc:
        raise unprocessable(f'create_custom_loss {req.name!r}: {exc}') from None
    rid = svc.futures.create(who.name, session_id=req.session_id, op='create_custom_loss')
    svc.futures.resolve(rid, {'loss_id': loss_id, 'type': 'create_custom_loss'})
    return {'request_id': rid}


@router.post('/forward_backward')
async def forward_backward(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    if request.headers.get('content-encoding', 'identity') not in ('identity', ''):
        raise bad_request(
            'compressed forward_backward bodies are not enabled on this server (client/config says '
            'proto_compress_fwdbwd=false); send the protobuf uncompressed'
        )
    if 'protobuf' not in request.headers.get('content-type', ''):
        raise ApiError(
            415,
            'forward_backward takes a ForwardBackwardRequest protobuf (Content-Type: '
            'application/x-protobuf), as sent by tinker >= 0.25',
        )
    msg = wire.parse_forward_backward(await request.body())
    m = svc.model(who.name, msg.model_id)  # 404 before anything else for unknown / other tenants' models
    svc.check_train_request(who.name, msg.model_id, wire.datum_lengths(msg))  # before any large allocation
    call = wire.decode_forward_backward(msg)
    losses.check_config(call.loss_fn, call.loss_config)  # unknown loss or bad loss_fn_config: 422 before queueing
    custom, config = None, dict(call.loss_config)
    if call.loss_fn == 'custom':  # another tenant's or session's loss id: 404, like any foreign id
        stored = svc.custom_losses.get(who.name, m.session_id, call.loss_config['loss_id'])
        if stored is None:
            raise not_found('custom loss', call.loss_config['loss_id'])
        host = svc.host(m.base_model)  # 429 throttled tenant, 422 disabled or over the model's budget
        config = await run_in_threadpool(
            custom_loss_admit.use_config, svc.config, host, who.name, stored.loss_id, stored.spec
        )
        custom = stored.spec
    elif call.loss_fn == 'cross_entropy' and datums.has_candidates(call.data):
        config['candidates'] = True  # soft targets: (N, K) target_tokens and weights
    if call.loss_fn == 'stable_reinforce':
        stability.apply_provenance(call.data, lambda sid: svc.stability.lookup(who.name, m.session_id, sid))
    host = svc.host(m.base_model)
    encoder = images.encoder_for(m.base_model, host.model_dir)
    if encoder.accepts_images:  # sizing and decoding images is CPU work: off the event loop
        rows = await run_in_threadpool(_image_rows, svc, who.name, call, encoder, custom)
    else:
        rows = datums.to_rows(call.data, call.loss_fn, encoder, custom=custom)
    if custom is not None:
        batch = TrainBatch(call.model_id, rows, '', forward_only=call.forward_only, graph=config)
    else:
        name, args = losses.twinkle_loss(call.loss_fn, config)
        batch = TrainBatch(call.model_id, rows, name, args, call.forward_only)
    widths = [d.inputs['target_tokens'].shape[1] if d.inputs['target_tokens'].ndim == 2 else 0 for d in call.data]

    def output(result: TrainResult) -> bytes:
        metrics = train_metrics(result)
        per_datum = [_shaped(lp, k) for lp, k in zip(datums.datum_logprobs(result.logprobs), widths)]
        return wire.encode_forward_backward_output(per_datum, metrics)

    rid = svc.training.forward_backward(who.name, call.model_id, call.seq_id, batch, post=output)
    return {'request_id': rid, 'model_id': call.model_id}


def _shaped(logprobs: list[Any], width: int) -> Any:
    """A datum's log-probs as the SDK expects them: [N], or [N, K] for 2-D target_tokens (`width` K > 0). Rows of
    candidate log-probs (lists) of a 1-D datum are its single column."""
    if width or not logprobs or not isinstance(logprobs[0], list):
        return logprobs
    return [row[0] for row in logprobs]


def _image_rows(
    svc: Service,
    tenant_name: str,
    call: wire.ForwardBackwardCall,
    encoder: images.ImageEncoder,
    custom: CustomLossSpec | None,
) -> list[dict[str, Any]]:
    """Rows of a request to a vision-language model: every datum is sized from its image headers and checked
    against the request caps (tokens, image pixels and decoding memory) before any pixel is decoded (and checked
    again once decoded: a processor that cannot count from a header leaves the client's expected_tokens in the
    first count)."""
    policy = svc.image_policy(tenant_name)
    sized = [encoder.measure(d.chunks, f'datum {i}', policy) for i, d in enumerate(call.data)]
    svc.check_train_request(tenant_name, call.model_id, [s.tokens for s in sized])
    policy.check_request(sized)
    rows = datums.to_rows(call.data, call.loss_fn, encoder, policy, custom)
    svc.check_train_request(tenant_name, call.model_id, [len(r['input_ids']) - 1 for r in rows])
    return rows


@router.post('/optim_step')
async def optim_step(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    req = parse(types.OptimStepRequest, await json_body(request))
    step = optimizers.optim_step(req.optim_params)  # AdamParams or DimuonParams, range-checked
    rid = svc.training.optim_step(who.name, req.model_id, req.seq_id, step)
    return {'request_id': rid, 'model_id': req.model_id}


@router.post('/unload_model')
async def unload_model(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    body = await json_body(request)
    model_id = str(body.get('model_id', ''))
    live = svc.model(who.name, model_id)
    svc.unload(model_id)
    rid = svc.futures.create(who.name, session_id=live.session_id, op='unload_model', model_id=model_id)
    svc.futures.resolve(rid, {'model_id': model_id, 'type': 'unload_model'})
    return {'request_id': rid, 'model_id': model_id}
