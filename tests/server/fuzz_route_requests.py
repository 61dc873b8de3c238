"""The requests `test_fuzz_routes.py` draws: `Request`, the `Fuzz` context (server, clients, ids) and one Hypothesis
strategy per route (`ROUTES`); the hand-written seed requests are `fuzz_route_seeds.py`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote

import httpx
from fuzz_strategies import (
    ANY_JSON,
    CHECKPOINT_FILE_QUERY,
    EXTREME_NUMBERS,
    TEXT,
    TTL_BODY,
    bent,
    from_json_schema,
    openai_chat_body,
    openai_completion_body,
    retrieve_futures_body,
)
from hypothesis import strategies as st
from raw_http import PROTO, datum, fwdbwd_body, fwdbwd_loss, optim_step
from server_names import MODEL
from tinker import types


@dataclass
class Request:
    method: str
    path: str
    json: Any = None
    content: bytes | None = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] | None = None


@dataclass
class Fuzz:
    """The server, alice's clients and objects (the fuzzed tenant), and bob's (who must keep training)."""

    base_url: str
    alice: httpx.Client
    bob: httpx.Client
    ids: st.SearchStrategy[str]
    session: str
    model: str
    sampling_session: str
    native_model: str
    native_sampler: str
    bob_model: str
    bob_seq: int = 1
    requests: int = 0

    def bob_step(self) -> None:
        fwdbwd_loss(self.bob, self.bob_model, self.bob_seq, [datum(8, 11)])
        optim_step(self.bob, self.bob_model, self.bob_seq + 1, lr=0.01)
        self.bob_seq += 2


# ---- request strategies, one per route ----------------------------------------------------------------------------


def _json(path: str, model: type | None = None) -> Callable[[Fuzz], st.SearchStrategy[Request]]:
    def build(f: Fuzz) -> st.SearchStrategy[Request]:
        body = bent(from_json_schema(model.model_json_schema(), f.ids)) if model else ANY_JSON
        return body.map(lambda b: Request('POST', path, json=b))

    return build


def _segment(text: str) -> str:
    """`text` as one URL path segment (every reserved character escaped)."""
    return quote(text, safe='')


def _fill(path: str, a: str, b: str) -> str:
    """`path` with its `{a}` / `{b}` placeholders filled by escaped segments."""
    return path.format(a=_segment(a), b=_segment(b))


def _get(path: str, **params: st.SearchStrategy[Any]) -> Callable[[Fuzz], st.SearchStrategy[Request]]:
    def build(f: Fuzz) -> st.SearchStrategy[Request]:
        fields = {k: v for k, v in params.items()}
        ids = f.ids | TEXT.filter(lambda s: s not in ('.', '..'))
        return st.builds(
            lambda values, a, b: Request('GET', _fill(path, a, b), params=values),
            st.fixed_dictionaries({}, optional=fields),
            ids,
            ids,
        )

    return build


def _path(
    method: str, path: str, body: st.SearchStrategy[Any] = st.none()
) -> Callable[[Fuzz], st.SearchStrategy[Request]]:
    def build(f: Fuzz) -> st.SearchStrategy[Request]:
        ids = f.ids | TEXT.filter(lambda s: s not in ('.', '..'))
        return st.builds(lambda a, b, j: Request(method, _fill(path, a, b), json=j), ids, ids, body)

    return build


@st.composite
def _datums(draw: st.DrawFn) -> list[types.Datum]:
    out = []
    for _ in range(draw(st.integers(0, 4))):
        tokens = draw(st.lists(st.integers(-3, 200_000), min_size=0, max_size=12))
        targets = draw(
            st.lists(st.integers(-3, 200_000), min_size=len(tokens), max_size=len(tokens))
            | st.lists(st.integers(0, 50), max_size=3)
        )
        inputs: dict[str, Any] = {'target_tokens': targets}
        for key in draw(st.lists(st.sampled_from(['weights', 'logprobs', 'advantages']), max_size=2, unique=True)):
            inputs[key] = draw(
                st.lists(
                    st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=len(tokens), max_size=len(tokens)
                )
            )
        out.append(types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs))
    return out


def _forward_backward(f: Fuzz) -> st.SearchStrategy[Request]:
    models = st.sampled_from([f.model, f.bob_model, 'nope', f.native_model])
    losses = st.sampled_from(['cross_entropy', 'importance_sampling', 'ppo', 'cispo', 'dro', 'custom', 'made_up'])
    seqs = st.integers(-1, 5) | EXTREME_NUMBERS.filter(lambda v: isinstance(v, int) and 0 <= v < 2**31)
    proto = st.builds(fwdbwd_body, models, seqs, _datums(), losses, st.booleans())
    garbled = st.builds(
        lambda body, at, byte: body[:at] + bytes([byte]) + body[at + 1 :],
        proto,
        st.integers(0, 60),
        st.integers(0, 255),
    )
    return (proto | garbled | st.binary(max_size=200)).map(
        lambda b: Request('POST', '/api/v1/forward_backward', content=b, headers=PROTO)
    )


def _native_call(kind: str) -> Callable[[Fuzz], st.SearchStrategy[Request]]:
    from twinkle_server.api.native.routes import MODEL_METHODS, SAMPLER_METHODS

    methods = sorted(MODEL_METHODS if kind == 'models' else SAMPLER_METHODS)

    def build(f: Fuzz) -> st.SearchStrategy[Request]:
        owner = st.sampled_from([f.native_model, f.bob_model] if kind == 'models' else [f.native_sampler, 'nope'])
        body = bent(
            st.fixed_dictionaries(
                {'args': st.lists(ANY_JSON, max_size=3), 'kwargs': st.dictionaries(TEXT, ANY_JSON, max_size=3)}
            )
        )
        return st.builds(
            lambda o, m, b: Request('POST', f'/twinkle/v1/{kind}/{o}/call/{m}', json=b),
            owner,
            st.sampled_from(methods) | TEXT.filter(lambda s: s not in ('.', '..')).map(_segment),
            body,
        )

    return build


def _fields(path: str, fields: dict[str, st.SearchStrategy[Any]]) -> Callable[[Fuzz], st.SearchStrategy[Request]]:
    def build(f: Fuzz) -> st.SearchStrategy[Request]:
        return bent(st.fixed_dictionaries(fields)).map(lambda b: Request('POST', path, json=b))

    return build


def _openai(path: str, body: Callable[[st.SearchStrategy[str]], st.SearchStrategy[Any]]) -> Callable[[Fuzz], Any]:
    def build(f: Fuzz) -> st.SearchStrategy[Request]:
        return body(st.sampled_from([MODEL, f'{MODEL}:bob-ck', 'gpt-9']) | f.ids).map(
            lambda b: Request('POST', path, json=b)
        )

    return build


INTS = st.integers(-2, 100) | EXTREME_NUMBERS
ROUTES: dict[tuple[str, str], Callable[[Fuzz], st.SearchStrategy[Request]]] = {
    ('post', '/api/v1/client/config'): _json('/api/v1/client/config'),
    ('post', '/api/v1/client/dynamic_config'): _json('/api/v1/client/dynamic_config'),
    ('post', '/api/v1/create_session'): _json('/api/v1/create_session', types.CreateSessionRequest),
    ('post', '/api/v1/session_heartbeat'): _json('/api/v1/session_heartbeat', types.SessionHeartbeatRequest),
    ('post', '/api/v1/sessions/{session_id}/finish'): _path('POST', '/api/v1/sessions/{a}/finish'),
    ('post', '/api/v1/telemetry'): _json('/api/v1/telemetry'),
    ('get', '/api/v1/get_server_capabilities'): _get('/api/v1/get_server_capabilities'),
    ('get', '/api/v1/healthz'): _get('/api/v1/healthz'),
    ('post', '/api/v1/create_model'): _json('/api/v1/create_model', types.CreateModelRequest),
    ('post', '/api/v1/get_info'): _json('/api/v1/get_info', types.GetInfoRequest),
    ('post', '/api/v1/forward_backward'): _forward_backward,
    ('post', '/api/v1/create_custom_loss'): _json('/api/v1/create_custom_loss', types.CreateCustomLossRequest),
    ('post', '/api/v1/optim_step'): _json('/api/v1/optim_step', types.OptimStepRequest),
    ('post', '/api/v1/unload_model'): _json('/api/v1/unload_model', types.UnloadModelRequest),
    ('post', '/api/v1/save_weights'): _json('/api/v1/save_weights', types.SaveWeightsRequest),
    ('post', '/api/v1/save_weights_for_sampler'): _json(
        '/api/v1/save_weights_for_sampler', types.SaveWeightsForSamplerRequest
    ),
    ('post', '/api/v1/load_weights'): _json('/api/v1/load_weights', types.LoadWeightsRequest),
    ('post', '/api/v1/weights_info'): _fields('/api/v1/weights_info', {'tinker_path': TEXT}),
    ('get', '/api/v1/training_runs'): _get('/api/v1/training_runs', limit=INTS, offset=INTS),
    ('get', '/api/v1/training_runs/{run_id}'): _get('/api/v1/training_runs/{a}'),
    ('get', '/api/v1/training_runs/{run_id}/checkpoints'): _get('/api/v1/training_runs/{a}/checkpoints'),
    ('get', '/api/v1/checkpoints'): _get('/api/v1/checkpoints', limit=INTS, offset=INTS),
    ('delete', '/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}'): _path(
        'DELETE', '/api/v1/training_runs/{a}/checkpoints/{b}'
    ),
    ('post', '/api/v1/create_sampling_session'): _json(
        '/api/v1/create_sampling_session', types.CreateSamplingSessionRequest
    ),
    ('get', '/api/v1/samplers/{sampler_id}'): _get('/api/v1/samplers/{a}'),
    ('post', '/api/v1/asample'): _json('/api/v1/asample', types.SampleRequest),
    ('post', '/api/v1/retrieve_future'): _json('/api/v1/retrieve_future', types.FutureRetrieveRequest),
    # sessions, futures and weight operations (SDK 0.38 parity)
    ('get', '/api/v1/sessions'): _get(
        '/api/v1/sessions', limit=INTS, offset=INTS, access_scope=st.sampled_from(['owned', 'accessible']) | TEXT
    ),
    ('get', '/api/v1/sessions/{session_id}'): _get(
        '/api/v1/sessions/{a}', access_scope=st.sampled_from(['owned', 'accessible']) | TEXT
    ),
    ('post', '/api/v1/sessions/search'): _json('/api/v1/sessions/search', types.SessionSearchRequest),
    ('post', '/api/v1/join_sampling_session'): _json('/api/v1/join_sampling_session', types.JoinSamplingSessionRequest),
    ('post', '/api/v1/retrieve_futures'): lambda f: retrieve_futures_body(f.ids).map(
        lambda b: Request('POST', '/api/v1/retrieve_futures', json=b)
    ),
    ('post', '/api/v1/cancel_future'): _json('/api/v1/cancel_future', types.FutureRetrieveRequest),
    ('post', '/api/v1/save_weights_external'): _json('/api/v1/save_weights_external', types.SaveWeightsExternalRequest),
    ('get', '/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}/external_weights_urls'): _get(
        '/api/v1/training_runs/{a}/checkpoints/{b}/external_weights_urls'
    ),
    ('get', '/api/v1/checkpoint_files/{file}'): _get('/api/v1/checkpoint_files/{a}', **CHECKPOINT_FILE_QUERY),
    ('post', '/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}/publish'): _path(
        'POST', '/api/v1/training_runs/{a}/checkpoints/{b}/publish'
    ),
    ('delete', '/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}/publish'): _path(
        'DELETE', '/api/v1/training_runs/{a}/checkpoints/{b}/publish'
    ),
    ('put', '/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}/ttl'): _path(
        'PUT', '/api/v1/training_runs/{a}/checkpoints/{b}/ttl', TTL_BODY
    ),
    ('post', '/api/v1/copy_weights'): _json('/api/v1/copy_weights', types.CopyWeightsRequest),
    ('put', '/api/v1/sessions/{session_id}/project'): _path(
        'PUT', '/api/v1/sessions/{a}/project', st.fixed_dictionaries({'project_id': TEXT | INTS | st.none()}) | ANY_JSON
    ),
    ('get', '/api/v1/sessions/{session_id}/trace_export'): _get('/api/v1/sessions/{a}/trace_export'),
    ('get', '/api/v1/session_traces/{session_id}'): _get(
        '/api/v1/session_traces/{a}',
        owner=st.sampled_from(['alice', 'bob']) | TEXT,
        expires=st.integers(-2, 2**40) | EXTREME_NUMBERS,
        sig=st.text(alphabet='0123456789abcdef', min_size=64, max_size=64) | TEXT,
    ),
    ('get', '/v1/models'): _get('/v1/models'),
    ('get', '/v1/models/{model}'): _get('/v1/models/{a}'),
    ('post', '/v1/chat/completions'): _openai('/v1/chat/completions', openai_chat_body),
    ('post', '/v1/completions'): _openai('/v1/completions', openai_completion_body),
    ('post', '/v1/rollouts'): _fields(
        '/v1/rollouts',
        {'model': st.sampled_from([MODEL, 'gpt-9']) | TEXT, 'ttl_s': INTS, 'max_calls': INTS, 'max_tokens': INTS},
    ),
    ('get', '/v1/rollouts/{session_id}'): _get('/v1/rollouts/{a}'),
    ('delete', '/v1/rollouts/{session_id}'): _path('DELETE', '/v1/rollouts/{a}'),
    ('post', '/v1/rollouts/{session_id}/reward'): _path(
        'POST',
        '/v1/rollouts/{a}/reward',
        st.fixed_dictionaries({}, optional={'reward': INTS, 'rewards': st.lists(INTS, max_size=4)}) | ANY_JSON,
    ),
    ('get', '/v1/rollouts/{session_id}/episodes'): _get('/v1/rollouts/{a}/episodes'),
    ('post', '/v1/rollouts/{session_id}/v1/chat/completions'): _path(
        'POST', '/v1/rollouts/{a}/v1/chat/completions', openai_chat_body(st.sampled_from([MODEL, 'gpt-9']))
    ),
    ('get', '/v1/rollouts/{session_id}/v1/models'): _get('/v1/rollouts/{a}/v1/models'),
    ('post', '/twinkle/v1/models'): _fields(
        '/twinkle/v1/models',
        {
            'base_model': st.sampled_from([MODEL, 'gpt-9', '../x']) | TEXT,
            'config': st.dictionaries(
                st.sampled_from(['r', 'lora_alpha', 'target_modules', 'lora_dropout']), INTS | TEXT, max_size=3
            )
            | ANY_JSON,
            'seed': INTS,
            'gradient_accumulation_steps': INTS,
        },
    ),
    ('post', '/twinkle/v1/models/load'): _fields(
        '/twinkle/v1/models/load',
        {'path': TEXT | st.sampled_from(['twinkle://x', '/etc/passwd', 'tinker://a/b/c']), 'load_optimizer': ANY_JSON},
    ),
    ('post', '/twinkle/v1/models/{model_id}/call/{method}'): _native_call('models'),
    ('post', '/twinkle/v1/samplers'): _fields(
        '/twinkle/v1/samplers', {'base_model': st.sampled_from([MODEL, 'gpt-9']) | ANY_JSON, 'model_path': ANY_JSON}
    ),
    ('post', '/twinkle/v1/samplers/{sampler_id}/call/{method}'): _native_call('samplers'),
    ('post', '/twinkle/v1/datasets'): _fields(
        '/twinkle/v1/datasets',
        {
            'meta': st.fixed_dictionaries(
                {
                    'dataset_id_or_path': st.sampled_from(
                        ['hf://secretdir/.', 'ms://secretdir/.', 'hf://../x', '/etc/passwd', 'secretdir']
                    )
                    | TEXT
                },
                optional={'data_slice': ANY_JSON},
            )
            | ANY_JSON,
            'steps': st.lists(
                st.lists(ANY_JSON | st.sampled_from(['set_template', 'map', 'encode']), max_size=3), max_size=3
            ),
        },
    ),
}
