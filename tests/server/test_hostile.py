"""Hostile and malformed requests across every route (Tinker and native): each is a client mistake, so each answers a
4xx with the project's JSON error body that names the problem — never a 5xx, never a hang — and each is followed by
a training step of another tenant (bob) that succeeds. At the end bob's adapter is bit-identical to a solo run of
the same steps: nothing alice sent touched it.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import torch
from raw_http import PROTO, assert_refused, datum, fwdbwd_body, fwdbwd_loss, new_model, optim_step, result
from safetensors.torch import load_file
from server_names import MODEL
from tinker import types

TIMEOUT_S = 30.0  # every request is answered within this (a hang fails the test)


@dataclass
class Ctx:
    """Clients and ids the cases aim at. alice is the hostile tenant; bob trains between her requests."""

    api: httpx.Client  # alice, /api/v1
    native: httpx.Client  # alice, /twinkle/v1
    anon: httpx.Client  # no key, server root
    bob: httpx.Client  # bob, /api/v1
    session: str
    model: str
    native_model: str
    bob_model: str
    bob_checkpoint: str
    sampling_session: str
    sampler: str
    context: int
    alice_seq: int = 1
    bob_seq: int = 1
    bob_steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def seq(self) -> int:
        """A fresh seq_id of alice's model for a request that will be refused (the guard frees it)."""
        self.alice_seq += 1
        return self.alice_seq

    def bob_step(self) -> None:
        fwdbwd_loss(self.bob, self.bob_model, self.bob_seq, [datum(8, 11)])
        optim_step(self.bob, self.bob_model, self.bob_seq + 1, lr=0.05)
        self.bob_seq += 2
        self.bob_steps += 1


@pytest.fixture(scope='module')
def ctx(server, alice, bob):
    timeout = httpx.Timeout(TIMEOUT_S)
    api = httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': alice}, timeout=timeout)
    native = httpx.Client(base_url=server.base_url + '/twinkle/v1', headers={'X-API-Key': alice}, timeout=timeout)
    anon = httpx.Client(base_url=server.base_url, timeout=timeout)
    bob_http = httpx.Client(base_url=server.base_url + '/api/v1', headers={'X-API-Key': bob}, timeout=timeout)
    session, model = new_model(api, MODEL)
    _, bob_model = new_model(bob_http, MODEL, rank=4, seed=7)
    save = bob_http.post('/save_weights', json={'model_id': bob_model, 'seq_id': 1, 'path': 'bob-ck'})
    bob_checkpoint = result(bob_http, save.json()['request_id'])['path']
    sampling = api.post(
        '/create_sampling_session', json={'session_id': session, 'sampling_session_seq_id': 0, 'base_model': MODEL}
    ).json()['sampling_session_id']
    native_model = native.post('/models', json={'base_model': MODEL, 'config': {'r': 2}}).json()['model_id']
    sampler = native.post('/samplers', json={'base_model': MODEL}).json()['sampler_id']
    c = Ctx(
        api,
        native,
        anon,
        bob_http,
        session,
        model,
        native_model,
        bob_model,
        bob_checkpoint,
        sampling,
        sampler,
        server.service.hosts[MODEL].max_context_length,
        bob_seq=2,
    )
    yield c
    for client in (api, native, anon, bob_http):
        client.close()


def _tinker_prompt(tokens: list[int]) -> dict:
    return {'chunks': [{'type': 'encoded_text', 'tokens': tokens}]}


def _sample(c: Ctx, **overrides: Any) -> httpx.Response:
    body = {
        'sampling_session_id': c.sampling_session,
        'seq_id': 0,
        'num_samples': 1,
        'prompt': _tinker_prompt([5, 6, 7]),
        'sampling_params': {'max_tokens': 2},
    }
    body.update(overrides)
    return c.api.post('/asample', json=body)


def _fb(c: Ctx, datums: list, loss_fn: str = 'cross_entropy', model: str | None = None) -> httpx.Response:
    return c.api.post(
        '/forward_backward', content=fwdbwd_body(model or c.model, c.seq(), datums, loss_fn), headers=PROTO
    )


def _optim(c: Ctx, adam: dict | str) -> httpx.Response:
    if isinstance(adam, str):  # raw JSON text (NaN / Infinity are not JSON, but Python's parser takes them)
        return c.api.post(
            '/optim_step', content=f'{{"model_id": "{c.model}", "seq_id": {c.seq()}, "adam_params": {adam}}}'.encode()
        )
    return c.api.post('/optim_step', json={'model_id': c.model, 'seq_id': c.seq(), 'adam_params': adam})


def _call(c: Ctx, method: str, body: Any, model: str | None = None) -> httpx.Response:
    return c.native.post(f'/models/{model or c.native_model}/call/{method}', json=body)


def _bad_dtype_body(c: Ctx) -> bytes:
    from tinker.proto import tinker_public_pb2 as pb

    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(fwdbwd_body(c.model, c.seq(), [datum()]))
    msg.data[0].loss_fn_inputs['weights'].dtype = 99
    return msg.SerializeToString()


def _nested(depth: int) -> bytes:
    return b'{"tags": [], "sdk_version": "x", "user_metadata": ' + b'{"a": ' * depth + b'1' + b'}' * depth + b'}'


Case = tuple[Callable[[Ctx], httpx.Response], int, str]
CASES: dict[str, Case] = {
    # ---- authentication and routing ----
    'no api key': (lambda c: c.anon.post('/api/v1/create_session', json={}), 401, 'Missing or invalid API key'),
    'unknown api key': (
        lambda c: c.anon.post('/api/v1/create_session', json={}, headers={'X-API-Key': 'tml-000000000000' + 'x' * 40}),
        401,
        'Missing or invalid API key',
    ),
    'bearer junk': (
        lambda c: c.anon.get('/api/v1/get_server_capabilities', headers={'Authorization': 'Bearer nope'}),
        401,
        'invalid API key',
    ),
    'unknown tinker route': (lambda c: c.api.post('/no_such_route', json={}), 404, 'no route POST /api/v1/no_such'),
    'unknown native route': (lambda c: c.native.get('/nothing'), 404, 'no route GET /twinkle/v1/nothing'),
    'wrong method': (lambda c: c.api.delete('/create_session'), 405, 'DELETE is not allowed'),
    # ---- sessions ----
    'body not JSON': (lambda c: c.api.post('/create_session', content=b'{"tags": ['), 400, 'not valid JSON'),
    'body a JSON list': (lambda c: c.api.post('/create_session', json=[1, 2]), 400, 'must be a JSON object'),
    'deeply nested JSON': (lambda c: c.api.post('/create_session', content=_nested(200_000)), 400, 'nested too'),
    'tags not a list': (
        lambda c: c.api.post('/create_session', json={'tags': 5, 'user_metadata': None, 'sdk_version': 'x'}),
        400,
        'tags',
    ),
    'heartbeat unknown session': (
        lambda c: c.api.post('/session_heartbeat', json={'session_id': 'sess-nope'}),
        404,
        "session 'sess-nope' not found",
    ),
    'heartbeat without session_id': (lambda c: c.api.post('/session_heartbeat', json={}), 400, 'session_id'),
    'finish unknown session': (lambda c: c.api.post('/sessions/sess-nope/finish'), 404, 'not found'),
    # ---- create_model / get_info / unload ----
    'create_model unknown session': (
        lambda c: c.api.post(
            '/create_model',
            json={'session_id': 'sess-nope', 'model_seq_id': 5, 'base_model': MODEL, 'lora_config': {'rank': 2}},
        ),
        404,
        'not found',
    ),
    'create_model unknown base model': (
        lambda c: c.api.post(
            '/create_model',
            json={'session_id': c.session, 'model_seq_id': 50, 'base_model': 'gpt-9', 'lora_config': {'rank': 2}},
        ),
        404,
        'is not served here',
    ),
    'create_model full fine-tuning': (
        lambda c: c.api.post('/create_model', json={'session_id': c.session, 'model_seq_id': 51, 'base_model': MODEL}),
        422,
        'full fine-tuning',
    ),
    'create_model rank 0': (
        lambda c: c.api.post(
            '/create_model',
            json={'session_id': c.session, 'model_seq_id': 52, 'base_model': MODEL, 'lora_config': {'rank': 0}},
        ),
        422,
        'rank must be an integer >= 1',
    ),
    'create_model rank "x"': (
        lambda c: c.api.post(
            '/create_model',
            json={'session_id': c.session, 'model_seq_id': 53, 'base_model': MODEL, 'lora_config': {'rank': 'x'}},
        ),
        400,
        'lora_config.rank',
    ),
    'create_model rank 1e9': (
        lambda c: c.api.post(
            '/create_model',
            json={'session_id': c.session, 'model_seq_id': 54, 'base_model': MODEL, 'lora_config': {'rank': 10**9}},
        ),
        422,
        'max_lora_rank=128',
    ),
    'create_model rank 1e9 as a float': (
        lambda c: c.api.post(
            '/create_model',
            json={'session_id': c.session, 'model_seq_id': 55, 'base_model': MODEL, 'lora_config': {'rank': 1e9}},
        ),
        422,
        'max_lora_rank=128',
    ),
    'get_info unknown model': (lambda c: c.api.post('/get_info', json={'model_id': 'm-nope'}), 404, 'not found'),
    "get_info of bob's model": (lambda c: c.api.post('/get_info', json={'model_id': c.bob_model}), 404, 'not found'),
    "unload bob's model": (lambda c: c.api.post('/unload_model', json={'model_id': c.bob_model}), 404, 'not found'),
    # ---- forward_backward ----
    'forward_backward as JSON': (
        lambda c: c.api.post('/forward_backward', json={'model_id': c.model}),
        415,
        'ForwardBackwardRequest protobuf',
    ),
    'forward_backward garbage': (
        lambda c: c.api.post('/forward_backward', content=b'\xff\x00garbage', headers=PROTO),
        400,
        'not a valid ForwardBackwardRequest',
    ),
    'forward_backward gzip': (
        lambda c: c.api.post(
            '/forward_backward',
            content=gzip.compress(fwdbwd_body(c.model, c.seq(), [datum()])),
            headers={**PROTO, 'Content-Encoding': 'gzip'},
        ),
        400,
        'compressed',
    ),
    'forward_backward no data': (lambda c: _fb(c, []), 422, 'has no data'),
    "forward_backward on bob's model": (lambda c: _fb(c, [datum()], model=c.bob_model), 404, 'not found'),
    'forward_backward image chunk': (
        lambda c: _fb(
            c,
            [
                types.Datum(
                    model_input=types.ModelInput(chunks=[types.ImageChunk(data=b'\x89PNG', format='png')]),
                    loss_fn_inputs={'target_tokens': [1]},
                )
            ],
        ),
        400,
        'does not accept images',
    ),
    'forward_backward unknown loss': (lambda c: _fb(c, [datum()], 'made_up'), 422, "unknown loss_fn 'made_up'"),
    'forward_backward length mismatch': (
        lambda c: _fb(
            c,
            [types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]), loss_fn_inputs={'target_tokens': [6, 7]})],
        ),
        422,
        'has 2 values but the model input has 3 tokens',
    ),
    'forward_backward RL inputs missing': (lambda c: _fb(c, [datum()], 'ppo'), 422, 'missing'),
    'forward_backward too many tokens': (lambda c: _fb(c, [datum(1000)] * 40), 413, 'max_tokens_per_request'),
    'forward_backward too many rows': (lambda c: _fb(c, [datum(1)] * 1025), 413, 'max_rows_per_request=1024'),
    'forward_backward longer than the context': (lambda c: _fb(c, [datum(c.context)]), 413, 'context length'),
    'forward_backward body over the limit': (
        lambda c: c.api.post(
            '/forward_backward', content=fwdbwd_body(c.model, c.seq(), [datum(200)] * 800), headers=PROTO
        ),
        413,
        'exceeds the server limit',
    ),
    'forward_backward chunked over the limit': (
        lambda c: c.api.post(
            '/forward_backward', content=iter([fwdbwd_body(c.model, c.seq(), [datum(200)] * 800)]), headers=PROTO
        ),
        413,
        'exceeds the server limit',
    ),
    'forward_backward bad dtype': (
        lambda c: c.api.post('/forward_backward', content=_bad_dtype_body(c), headers=PROTO),
        422,
        'unsupported dtype',
    ),
    # ---- optim_step ----
    'optim_step lr NaN': (lambda c: _optim(c, '{"learning_rate": NaN}'), 400, 'learning_rate must be a finite'),
    'optim_step lr Infinity': (lambda c: _optim(c, '{"learning_rate": Infinity}'), 400, 'learning_rate'),
    'optim_step lr negative': (lambda c: _optim(c, {'learning_rate': -0.1}), 400, 'learning_rate'),
    'optim_step beta2 2': (lambda c: _optim(c, {'learning_rate': 1e-3, 'beta2': 2.0}), 400, 'beta2'),
    'optim_step eps negative': (lambda c: _optim(c, {'learning_rate': 1e-3, 'eps': -1e-8}), 400, 'eps'),
    'optim_step weight_decay negative': (
        lambda c: _optim(c, {'learning_rate': 1e-3, 'weight_decay': -1}),
        400,
        'weight_decay',
    ),
    'optim_step unknown model': (
        lambda c: c.api.post(
            '/optim_step', json={'model_id': 'm-nope', 'seq_id': 1, 'adam_params': {'learning_rate': 0.1}}
        ),
        404,
        'not found',
    ),
    'optim_step without params': (
        lambda c: c.api.post('/optim_step', json={'model_id': c.model, 'seq_id': c.seq()}),
        400,
        'Field required',
    ),
    # ---- checkpoints ----
    'save_weights without a name': (
        lambda c: c.api.post('/save_weights', json={'model_id': c.model, 'seq_id': c.seq()}),
        400,
        'needs',
    ),
    'save_weights name too long': (
        lambda c: c.api.post('/save_weights', json={'model_id': c.model, 'seq_id': c.seq(), 'path': 'n' * 300}),
        400,
        'too long',
    ),
    'save_weights path traversal': (
        lambda c: c.api.post('/save_weights', json={'model_id': c.model, 'seq_id': c.seq(), 'path': '../../etc'}),
        400,
        'invalid checkpoint name',
    ),
    'save_weights hidden name': (
        lambda c: c.api.post('/save_weights', json={'model_id': c.model, 'seq_id': c.seq(), 'path': '.tmp-x'}),
        400,
        'invalid checkpoint name',
    ),
    'save_weights_for_sampler neither': (
        lambda c: c.api.post('/save_weights_for_sampler', json={'model_id': c.model, 'seq_id': c.seq()}),
        400,
        'needs `path`',
    ),
    'load_weights bad scheme': (
        lambda c: c.api.post(
            '/load_weights', json={'model_id': c.model, 'seq_id': c.seq(), 'path': 's3://bucket/x', 'optimizer': False}
        ),
        400,
        'invalid checkpoint path',
    ),
    "load_weights of bob's checkpoint": (
        lambda c: c.api.post(
            '/load_weights', json={'model_id': c.model, 'seq_id': c.seq(), 'path': c.bob_checkpoint, 'optimizer': True}
        ),
        404,
        'not found',
    ),
    "new model from bob's checkpoint": (
        lambda c: c.api.post(
            '/load_weights',
            json={'session_id': c.session, 'model_seq_id': 60, 'path': c.bob_checkpoint, 'optimizer': False},
        ),
        404,
        'not found',
    ),
    'weights_info without a path': (lambda c: c.api.post('/weights_info', json={}), 400, 'tinker_path'),
    "weights_info of bob's checkpoint": (
        lambda c: c.api.post('/weights_info', json={'tinker_path': c.bob_checkpoint}),
        404,
        'not found',
    ),
    'training_runs limit 0': (lambda c: c.api.get('/training_runs', params={'limit': 0}), 400, 'limit'),
    'checkpoints offset -1': (lambda c: c.api.get('/checkpoints', params={'offset': -1}), 400, 'offset'),
    "bob's training run": (lambda c: c.api.get(f'/training_runs/{c.bob_model}'), 404, 'not found'),
    'checkpoints of an unknown run': (lambda c: c.api.get('/training_runs/nope/checkpoints'), 404, 'not found'),
    'delete with a malformed id': (
        lambda c: c.api.delete(f'/training_runs/{c.model}/checkpoints/x'),
        422,
        'must look like',
    ),
    "delete bob's checkpoint": (
        lambda c: c.api.delete(f'/training_runs/{c.bob_model}/checkpoints/weights/bob-ck'),
        404,
        'not found',
    ),
    # ---- sampling ----
    'sampling session without a model': (
        lambda c: c.api.post('/create_sampling_session', json={'session_id': c.session, 'sampling_session_seq_id': 9}),
        422,
        'needs model_path',
    ),
    'sampling session unknown base': (
        lambda c: c.api.post(
            '/create_sampling_session',
            json={'session_id': c.session, 'sampling_session_seq_id': 10, 'base_model': 'gpt-9'},
        ),
        404,
        'not served',
    ),
    'unknown sampler': (lambda c: c.api.get('/samplers/nope'), 404, 'not found'),
    'asample num_samples 100000': (lambda c: _sample(c, num_samples=100_000), 400, 'max_num_samples=64'),
    'asample num_samples 0': (lambda c: _sample(c, num_samples=0), 400, 'num_samples must be >= 1'),
    'asample max_tokens 0': (lambda c: _sample(c, sampling_params={'max_tokens': 0}), 400, 'max_tokens'),
    'asample max_tokens 100000': (
        lambda c: _sample(c, sampling_params={'max_tokens': 100_000}),
        400,
        'max_sample_tokens=4096',
    ),
    'asample empty prompt': (lambda c: _sample(c, prompt=_tinker_prompt([])), 422, 'no tokens'),
    'asample top-k above the cap': (lambda c: _sample(c, topk_prompt_logprobs=10_000), 400, 'max_topk_logprobs=64'),
    'asample top-k negative': (lambda c: _sample(c, topk_sample_logprobs=-1), 400, 'topk_sample_logprobs must be'),
    'asample last_n without prompt logprobs': (
        lambda c: _sample(c, prompt_logprobs_last_n=1),
        400,
        'set prompt_logprobs=true',
    ),
    'asample last_n beyond the prompt': (
        lambda c: _sample(c, prompt_logprobs=True, prompt_logprobs_last_n=3),
        422,
        'more than the prompt',
    ),
    'asample target ids of a wrong shape': (
        lambda c: _sample(c, target_prompt_logprobs={'data': [1, 2, 3], 'dtype': 'int64', 'shape': [3]}),
        400,
        'must be 2-D',
    ),
    'asample target ids float': (
        lambda c: _sample(c, target_prompt_logprobs={'data': [1.5, 2.0], 'dtype': 'float32', 'shape': [2, 1]}),
        400,
        'int64 tensor',
    ),
    'asample target ids bad CSR': (
        lambda c: _sample(
            c,
            target_prompt_logprobs={
                'data': [1],
                'dtype': 'int64',
                'shape': [2, 1],
                'sparse_crow_indices': [0, 5, 1],
                'sparse_col_indices': [0],
            },
        ),
        400,
        'malformed sparse CSR',
    ),
    'asample target ids of 10^12 cells': (
        lambda c: _sample(
            c,
            target_prompt_logprobs={
                'data': [1],
                'dtype': 'int64',
                'shape': [2, 10**12],
                'sparse_crow_indices': [0, 1, 1],
                'sparse_col_indices': [0],
            },
        ),
        400,
        'max_prompt_logprob_cells',
    ),
    'asample unknown session': (lambda c: _sample(c, sampling_session_id='nope'), 404, 'not found'),
    'asample over the context': (
        lambda c: _sample(c, prompt=_tinker_prompt([5] * (c.context - 1)), sampling_params={'max_tokens': 8}),
        422,
        'context length',
    ),
    'asample temperature negative': (
        lambda c: _sample(c, sampling_params={'max_tokens': 2, 'temperature': -1}),
        400,
        'temperature',
    ),
    'retrieve unknown future': (
        lambda c: c.api.post('/retrieve_future', json={'request_id': 'req-nope'}),
        404,
        'not found',
    ),
    'retrieve without request_id': (lambda c: c.api.post('/retrieve_future', json={}), 400, 'request_id'),
    # ---- native API ----
    'native r "x"': (
        lambda c: c.native.post('/models', json={'base_model': MODEL, 'config': {'r': 'x'}}),
        400,
        'config.r must be an integer',
    ),
    'native r 1e9': (
        lambda c: c.native.post('/models', json={'base_model': MODEL, 'config': {'r': 10**9}}),
        422,
        'max_lora_rank=128',
    ),
    'native lora_alpha text': (
        lambda c: c.native.post('/models', json={'base_model': MODEL, 'config': {'r': 2, 'lora_alpha': 'big'}}),
        400,
        'lora_alpha',
    ),
    'native target_modules 5': (
        lambda c: c.native.post('/models', json={'base_model': MODEL, 'config': {'r': 2, 'target_modules': 5}}),
        400,
        'target_modules',
    ),
    'native config a list': (
        lambda c: c.native.post('/models', json={'base_model': MODEL, 'config': [2]}),
        400,
        'config must be a JSON object',
    ),
    'native unknown base': (
        lambda c: c.native.post('/models', json={'base_model': 'gpt-9', 'config': {'r': 2}}),
        404,
        'not served',
    ),
    'native load bad path': (
        lambda c: c.native.post('/models/load', json={'path': '/etc/passwd'}),
        400,
        'invalid checkpoint path',
    ),
    'native unknown method': (lambda c: _call(c, '__class__', {}), 404, 'is not a remote Model method'),
    "native call on bob's model": (lambda c: _call(c, 'get_train_configs', {}, model=c.bob_model), 404, 'not found'),
    'native set_template outside the model': (
        lambda c: _call(c, 'set_template', {'args': ['Template'], 'kwargs': {'model_id_or_tokenizer': '/etc'}}),
        403,
        'inside the hosted model',
    ),
    'native set_template relative escape': (
        lambda c: _call(c, 'set_template', {'args': ['Template'], 'kwargs': {'model_id_or_tokenizer': '../../..'}}),
        403,
        'inside the hosted model',
    ),
    'native hub reference': (lambda c: _call(c, 'set_loss', {'args': ['hf://evil/loss']}), 403, 'hub reference'),
    'native args not a list': (lambda c: _call(c, 'set_loss', {'args': 'GRPOLoss'}), 400, 'call body'),
    'native save name too long': (lambda c: _call(c, 'save', {'args': ['n' * 300]}), 400, 'too long'),
    'native unknown sampler': (lambda c: c.native.post('/samplers/nope/call/sample', json={}), 404, 'not found'),
    'native sample without ids': (
        lambda c: c.native.post(f'/samplers/{c.sampler}/call/sample', json={'args': [{'messages': []}]}),
        422,
        'token ids',
    ),
    'native sample num_samples 100000': (
        lambda c: c.native.post(
            f'/samplers/{c.sampler}/call/sample',
            json={'args': [{'input_ids': [5, 6]}, {'max_tokens': 2, 'num_samples': 100_000}]},
        ),
        400,
        'max_num_samples',
    ),
    'native sample max_tokens 0': (
        lambda c: c.native.post(
            f'/samplers/{c.sampler}/call/sample', json={'args': [{'input_ids': [5, 6]}, {'max_tokens': 0}]}
        ),
        400,
        'max_tokens',
    ),
}


@pytest.mark.parametrize('name', list(CASES))
def test_hostile_request_is_refused_and_bob_keeps_training(ctx, name):
    send, status, needle = CASES[name]
    assert_refused(send(ctx), status, needle)
    ctx.bob_step()


def test_there_are_at_least_60_cases():
    assert len(CASES) >= 60


def test_bobs_adapter_is_bit_identical_to_a_solo_run(server, ctx):
    """bob trained once per case above; a fresh model with the same seed trains the same steps with nobody else
    sending anything, and both adapters are saved: every tensor must be equal, bit for bit."""
    assert ctx.bob_steps > 0
    _, solo = new_model(ctx.bob, MODEL, rank=4, seed=7)
    seq = 1
    for _ in range(ctx.bob_steps):
        fwdbwd_loss(ctx.bob, solo, seq, [datum(8, 11)])
        optim_step(ctx.bob, solo, seq + 1, lr=0.05)
        seq += 2
    paths = []
    for model_id, s in ((ctx.bob_model, ctx.bob_seq), (solo, seq)):
        r = ctx.bob.post('/save_weights_for_sampler', json={'model_id': model_id, 'seq_id': s, 'path': 'final'})
        paths.append(result(ctx.bob, r.json()['request_id'])['path'])
    ctx.bob_seq += 1
    tensors = [load_file(str(_checkpoint_dir(server, p) / 'adapter_model.safetensors')) for p in paths]
    assert tensors[0].keys() == tensors[1].keys() and tensors[0]
    for key in tensors[0]:
        assert torch.equal(tensors[0][key], tensors[1][key]), key


def _checkpoint_dir(server, uri: str) -> Path:
    from twinkle_server.store.checkpoint_files import parse_path

    cp = parse_path(uri)
    return server.service.files.directory('bob', cp)


def test_bob_really_trained(ctx):
    """Guards the comparison above against a no-op: bob's loss moved from where an untrained twin starts."""
    _, fresh = new_model(ctx.bob, MODEL, rank=4, seed=7)
    assert fwdbwd_loss(ctx.bob, fresh, 1, [datum(8, 11)], forward_only=True) != pytest.approx(
        fwdbwd_loss(ctx.bob, ctx.bob_model, ctx.bob_seq, [datum(8, 11)], forward_only=True), rel=1e-4
    )
    ctx.bob_seq += 1


def test_json_bodies_of_errors_have_one_shape(ctx):
    for r in (
        ctx.api.post('/nope'),
        ctx.api.post('/create_session', content=b'x'),
        ctx.anon.get('/api/v1/get_server_capabilities'),
    ):
        assert set(json.loads(r.content)) == {'error', 'category', 'detail', 'status'}
