"""Tinker sampling routes: create_sampling_session, GET samplers/{id}, asample (protobuf result)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from tinker import types

from twinkle_core.types import SampleResponse, SamplingParams
from twinkle_server.auth import Tenant
from twinkle_server.deps import json_body, parse, service, tenant
from twinkle_server.errors import bad_request, not_found, unprocessable
from twinkle_server.model_host.base import SampleJob
from twinkle_server.service import Service
from twinkle_server.tinker import images, wire

router = APIRouter(prefix='/api/v1')


@router.post('/create_sampling_session')
async def create_sampling_session(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    req = parse(types.CreateSamplingSessionRequest, await json_body(request))
    sid = svc.create_sampling_session(
        who.name, req.session_id, req.sampling_session_seq_id, req.model_path, req.base_model
    )
    return {'sampling_session_id': sid, 'type': 'create_sampling_session'}


@router.get('/samplers/{sampler_id}')
async def get_sampler(sampler_id: str, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    row = svc.store.sampling_session(sampler_id, who.name)
    if row is None:
        raise not_found('sampler', sampler_id)
    return {'sampler_id': row.sampling_session_id, 'base_model': row.base_model, 'model_path': row.model_path}


@router.post('/asample')
async def asample(request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)) -> dict:
    req = parse(types.SampleRequest, await json_body(request))
    if (
        req.topk_prompt_logprobs
        or req.topk_sample_logprobs
        or req.prompt_alt_tokens_k
        or req.target_prompt_logprobs is not None
        or req.prompt_logprobs_last_n is not None
    ):
        raise unprocessable(
            'top-k logprobs, target/alt prompt tokens and prompt_logprobs_last_n are not supported '
            'by this server; ask for prompt_logprobs=true and per-token sample logprobs instead'
        )
    base, _ = svc.sampling_target(who.name, req.sampling_session_id, req.model_path, req.base_model)
    host = svc.host(base)
    encoder = images.encoder_for(base, host.model_dir)
    chunks = _chunks(req.prompt)
    if encoder.accepts_images:  # sizing and decoding images is CPU work: off the event loop
        prompt = await run_in_threadpool(
            _image_prompt, encoder, chunks, host.max_context_length, svc.image_policy(who.name)
        )
    else:
        prompt = encoder.expand(chunks, 'prompt')
    job = SampleJob(
        prompt=prompt.tokens,
        params=_params(req.sampling_params),
        num_samples=req.num_samples,
        prompt_logprobs=bool(req.prompt_logprobs),
        images=prompt.image_fields(),
    )
    rid = svc.sample(
        who.name,
        req.sampling_session_id,
        req.model_path,
        req.base_model,
        job,
        post=lambda r: wire.encode_sample_response(
            r if isinstance(r, SampleResponse) else SampleResponse.model_validate(r)
        ),
    )
    return {'request_id': rid, 'sample_sequence_ids': [f'{rid}:{i}' for i in range(req.num_samples)]}


def _chunks(prompt: types.ModelInput) -> list[images.Chunk]:
    """The prompt's chunks: token ids and images (JSON carries image bytes as base64, decoded by the SDK model)."""
    chunks: list[images.Chunk] = []
    for i, chunk in enumerate(prompt.chunks):
        if isinstance(chunk, types.EncodedTextChunk):
            chunks.append(list(chunk.tokens))
        elif isinstance(chunk, types.ImageChunk):
            chunks.append(images.WireImage(chunk.data, chunk.format, chunk.expected_tokens))
        elif isinstance(chunk, types.ImageAssetPointerChunk):
            raise bad_request(
                f'prompt chunk {i}: image_asset_pointer chunks are not supported (this server does '
                f'not fetch images); send the image bytes as an ImageChunk'
            )
        else:
            raise unprocessable(
                f'prompt chunk {i} is a {type(chunk).__name__}; this server samples from token ids '
                f'(EncodedTextChunk) and images (ImageChunk)'
            )
    if not any(chunks):
        raise unprocessable('the prompt has no tokens')
    return chunks


def _image_prompt(
    encoder: images.ImageEncoder, chunks: list[images.Chunk], context: int, policy: images.ImagePolicy
) -> images.ModelTokens:
    """A prompt for a vision-language model, sized from its image headers (and refused when it cannot fit the
    context or `policy`) before any pixel is decoded."""
    sized = encoder.measure(chunks, 'prompt', policy)
    if sized.tokens >= context:
        raise unprocessable(
            f'the prompt has {sized.tokens} tokens (images counted) but the context length of '
            f'{encoder.base_model!r} is {context}'
        )
    policy.check_request([sized])
    return encoder.expand(chunks, 'prompt', policy)


def _params(p: Any) -> SamplingParams:
    stop = p.stop
    if stop is not None and not isinstance(stop, str):
        stop = list(stop)
    given = {'max_tokens': p.max_tokens} if p.max_tokens is not None else {}  # unset: SamplingParams' default
    try:
        return SamplingParams(**given, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, stop=stop, seed=p.seed)
    except ValidationError as exc:
        raise bad_request(f'invalid sampling_params: {exc.errors()[0]["loc"][0]}: {exc.errors()[0]["msg"]}') from None
