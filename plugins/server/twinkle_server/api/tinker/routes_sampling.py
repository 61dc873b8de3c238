"""Tinker sampling routes: create_sampling_session, GET samplers/{id}, asample (protobuf result).

`asample` serves every field of SDK 0.38's `SampleRequest`: top-k log-probs of the sampled tokens
(`topk_sample_logprobs`) and of the prompt positions (`topk_prompt_logprobs`), `prompt_logprobs_last_n`,
`target_prompt_logprobs` (dense or CSR, answered in the same layout) and `prompt_alt_tokens_k`; each maps onto a
`SamplingParams` field the host's sampler declares it supports (`SamplerCapabilities`), else the request fails with
a 422 naming what is missing. Widths and cells are bounded by the tenant's `max_topk_logprobs` and
`max_prompt_logprob_cells` (400).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from tinker import types

from twinkle_core.types import SampleResponse, SamplingParams
from twinkle_server.api.deps import json_body, parse, service, tenant
from twinkle_server.api.tinker import wire
from twinkle_server.engine.model_host.base import SampleJob
from twinkle_server.errors import bad_request, not_found, unprocessable
from twinkle_server.service import images, stability_records
from twinkle_server.service.auth import Tenant
from twinkle_server.service.core import Service

router = APIRouter(prefix='/api/v1')


@router.post('/create_sampling_session')
async def create_sampling_session(
    request: Request, who: Tenant = Depends(tenant), svc: Service = Depends(service)
) -> dict[str, Any]:
    req = parse(types.CreateSamplingSessionRequest, await json_body(request))
    sid = svc.sampling.create_sampling_session(
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
    _check_score_fields(req)
    target = svc.sampling.resolve_target(who.name, req.sampling_session_id, req.model_path, req.base_model)
    host = svc.host(target.base_model)
    encoder = images.encoder_for(target.base_model, host.model_dir)
    chunks = _chunks(req.prompt)
    if encoder.accepts_images:  # sizing and decoding images is CPU work: off the event loop
        prompt = await run_in_threadpool(
            _image_prompt, encoder, chunks, host.max_context_length, svc.image_policy(who.name)
        )
    else:
        prompt = encoder.expand(chunks, 'prompt')
    targets = _targets(req, len(prompt.tokens), svc.config.limits(who.name).max_prompt_logprob_cells)
    shapes = wire.ScoreShapes(req.topk_sample_logprobs, req.topk_prompt_logprobs, req.prompt_alt_tokens_k, targets)
    job = SampleJob(
        prompt=prompt.tokens,
        params=_params(req.sampling_params, _score_params(req, len(prompt.tokens), targets)),
        num_samples=req.num_samples,
        prompt_logprobs=bool(req.prompt_logprobs),
        images=prompt.image_fields(),
    )
    pending = stability_records.recorder(
        svc.stability, who.name, target.session_id, req.record_stability_info, prompt.tokens
    )
    rid = svc.sampling.sample(
        who.name,
        target,
        job,
        post=lambda r: wire.encode_sample_response(
            stability_records.recorded(
                pending, r if isinstance(r, SampleResponse) else SampleResponse.model_validate(r)
            ),
            shapes,
        ),
        seq_id=req.seq_id,  # which client of the sampling session sent it (its retrieve_futures reports it)
    )
    sequence_ids = [f'{rid}:{i}' for i in range(req.num_samples)]
    if pending is not None:  # record_stability_info: the sequences are recorded under these ids
        pending.bind(sequence_ids)
    return {'request_id': rid, 'sample_sequence_ids': sequence_ids}


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


def _check_score_fields(req: types.SampleRequest) -> None:
    """The request's own rules for the top-k / prompt-score fields (400), before any work."""
    for name in ('topk_prompt_logprobs', 'topk_sample_logprobs', 'prompt_alt_tokens_k'):
        if getattr(req, name) < 0:
            raise bad_request(f'{name} must be 0 (none) or a positive k, got {getattr(req, name)}')
    last_n = req.prompt_logprobs_last_n
    if last_n is not None:
        if last_n < 1:
            raise bad_request(f'prompt_logprobs_last_n must be 1 or greater, got {last_n}')
        if not req.prompt_logprobs:
            raise bad_request('prompt_logprobs_last_n applies to prompt logprobs; set prompt_logprobs=true')


def _targets(req: types.SampleRequest, length: int, max_cells: int | None) -> wire.TargetIds | None:
    """The request's `target_prompt_logprobs` as dense ids (-1 = none), checked against the prompt's `length`."""
    td = req.target_prompt_logprobs
    if td is None:
        return None
    targets = wire.decode_target_ids(td, max_cells)
    rows = targets.ids.shape[0]
    if rows != length - 1:
        raise unprocessable(
            f'target_prompt_logprobs has {rows} rows but the prompt has {length} tokens; it needs '
            f'len(prompt) - 1 = {length - 1} rows (row i scores prompt position i + 1)'
        )
    if not (targets.ids >= 0).any():
        raise unprocessable('target_prompt_logprobs names no token id (every cell is -1); name at least one')
    return targets


def _score_params(req: types.SampleRequest, length: int, targets: wire.TargetIds | None) -> dict[str, Any]:
    """`SamplingParams` fields of the request's top-k and prompt-score asks (checked against the prompt)."""
    last_n = req.prompt_logprobs_last_n
    if last_n is not None and last_n > length - 1:
        raise unprocessable(
            f"prompt_logprobs_last_n={last_n} is more than the prompt's {length - 1} scorable tokens "
            f'(len(prompt) - 1; position 0 has no logprob)'
        )
    if req.prompt_alt_tokens_k and length < 2:
        raise unprocessable('prompt_alt_tokens_k needs a prompt of at least 2 tokens (position 0 has no draws)')
    return {
        'prompt_logprobs': bool(req.prompt_logprobs),
        'top_logprobs': req.topk_sample_logprobs,
        'prompt_top_logprobs': req.topk_prompt_logprobs,
        'prompt_logprobs_last_n': last_n,
        'prompt_target_tokens': targets.ids.tolist() if targets is not None else None,
        'prompt_alt_tokens': req.prompt_alt_tokens_k,
    }


def _params(p: Any, scores: dict[str, Any] | None = None) -> SamplingParams:
    stop = p.stop
    if stop is not None and not isinstance(stop, str):
        stop = list(stop)
    given = {'max_tokens': p.max_tokens} if p.max_tokens is not None else {}  # unset: SamplingParams' default
    try:
        return SamplingParams(
            **given,
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            stop=stop,
            seed=p.seed,
            **(scores or {}),
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        where = error['loc'][0] if error['loc'] else 'sampling_params'
        raise bad_request(f'invalid sampling_params: {where}: {error["msg"]}') from None
