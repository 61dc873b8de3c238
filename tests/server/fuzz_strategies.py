"""Hypothesis strategies for the route fuzzer: request bodies drawn from the SDK's request models (their JSON schema),
then bent the way a hostile or buggy client bends them (wrong types, missing or unknown fields, extreme numbers,
real ids of the caller and of another tenant).

`from_json_schema` covers the subset of JSON Schema that pydantic emits for the tinker request models: `type`,
`properties`/`required`/`additionalProperties`, `items`, `enum`, `const`, `anyOf`/`oneOf`, `$ref` into `$defs`,
and `format: binary` (base64 text).
"""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import strategies as st

#: numbers a client can put in any numeric field: the edges of every integer and float type the server converts to
EXTREME_NUMBERS = st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**30, 1e-300, 3e38, 1e300, -1e300, 0.5, 1e9])
TEXT = st.text(max_size=40)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | EXTREME_NUMBERS | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def from_json_schema(schema: dict[str, Any], ids: st.SearchStrategy[str] = TEXT) -> st.SearchStrategy[Any]:
    """Values that mostly fit `schema` (a pydantic model's `model_json_schema()`); string fields named like an id
    draw from `ids` half of the time, so requests reach real objects instead of failing the lookup at once."""
    return _node(schema, schema.get('$defs', {}), ids, depth=0, name='')


def _node(
    node: dict[str, Any], defs: dict[str, Any], ids: st.SearchStrategy[str], depth: int, name: str
) -> st.SearchStrategy[Any]:
    if '$ref' in node:
        return st.deferred(lambda: _node(defs[node['$ref'].rsplit('/', 1)[-1]], defs, ids, depth + 1, name))
    if 'const' in node:
        return st.just(node['const'])
    if 'enum' in node:
        return st.sampled_from(node['enum'])
    for key in ('anyOf', 'oneOf'):
        if key in node:
            return st.one_of([_node(option, defs, ids, depth + 1, name) for option in node[key]])
    kind = node.get('type')
    if kind == 'object' or 'properties' in node:
        return _object(node, defs, ids, depth)
    if kind == 'array':
        items = _node(node.get('items', {}), defs, ids, depth + 1, name) if depth < 6 else ANY_JSON
        return st.lists(items, max_size=6 if depth < 3 else 2)
    if kind == 'string':
        if node.get('format') == 'binary':
            return st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode())
        return ids | TEXT if name.endswith('_id') or name in ('path', 'tinker_path', 'model_path') else TEXT
    if kind == 'integer':
        return st.integers(min_value=-5, max_value=4096) | EXTREME_NUMBERS.filter(lambda v: isinstance(v, int))
    if kind == 'number':
        return st.floats(allow_nan=False, allow_infinity=False, width=64) | EXTREME_NUMBERS
    if kind == 'boolean':
        return st.booleans()
    if kind == 'null':
        return st.none()
    return ANY_JSON


def _object(
    node: dict[str, Any], defs: dict[str, Any], ids: st.SearchStrategy[str], depth: int
) -> st.SearchStrategy[dict[str, Any]]:
    props = node.get('properties', {})
    required = [k for k in node.get('required', []) if k in props]
    optional = [k for k in props if k not in required]
    fields = {k: _node(v, defs, ids, depth + 1, k) for k, v in props.items()}
    return st.fixed_dictionaries({k: fields[k] for k in required}, optional={k: fields[k] for k in optional})


def bent(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`valid` values, and the same values with one field dropped, retyped or added (what clients get wrong)."""

    @st.composite
    def mutate(draw: st.DrawFn) -> Any:
        value = draw(valid)
        if not isinstance(value, dict) or not value:
            return draw(ANY_JSON)
        value = dict(value)
        key = draw(st.sampled_from(sorted(value)))
        how = draw(st.sampled_from(['drop', 'retype', 'add']))
        if how == 'drop':
            del value[key]
        elif how == 'retype':
            value[key] = draw(ANY_JSON)
        else:
            value[draw(TEXT)] = draw(ANY_JSON)
        return value

    return st.one_of(valid, mutate(), ANY_JSON)


# ---- the OpenAI-compatible routes (/v1/...) -------------------------------------------------------------------------
#: max_tokens of the OpenAI bodies that may sample: small, so a request that reaches the sampler stays quick
SMALL_MAX_TOKENS = st.integers(1, 3)
_SAMPLING = {
    'temperature': st.floats(0, 2) | EXTREME_NUMBERS,
    'top_p': st.floats(0, 1) | EXTREME_NUMBERS,
    'top_k': st.integers(-2, 5),
    'n': st.integers(1, 3) | EXTREME_NUMBERS,
    'stop': TEXT | st.lists(TEXT, max_size=20),
    'seed': st.integers(-(2**70), 2**70),
    'stream': st.booleans(),
    'stream_options': st.fixed_dictionaries({'include_usage': st.booleans()}),
    'frequency_penalty': st.sampled_from([0, 0.5]),
    'logit_bias': st.dictionaries(TEXT, st.floats(-100, 100), max_size=2),
}


def _openai_body(
    models: st.SearchStrategy[str], required: dict[str, st.SearchStrategy[Any]], optional: dict[str, Any]
) -> st.SearchStrategy[Any]:
    """A body that mostly fits, bent (`bent` makes the misfits); `max_tokens` stays small whenever the body has
    none (the route's default could sample to the context's end)."""
    valid = st.fixed_dictionaries(
        {'model': models, 'max_tokens': SMALL_MAX_TOKENS, **required}, optional={**_SAMPLING, **optional}
    )

    def small(body: Any) -> Any:
        if isinstance(body, dict) and not isinstance(body.get('max_tokens'), int):
            return {**body, 'max_tokens': 2}
        return body

    return bent(valid).map(small)


def openai_chat_body(models: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """`POST /v1/chat/completions` bodies: messages of every role (and a few unknown ones), text and non-text
    parts, tool calls, tools, tool_choice, log-prob settings."""
    call = st.fixed_dictionaries(
        {'id': TEXT, 'type': st.just('function'), 'function': st.fixed_dictionaries({'name': TEXT, 'arguments': TEXT})}
    )
    part = st.fixed_dictionaries({'type': st.sampled_from(['text', 'image_url']) | TEXT, 'text': TEXT})
    message = st.fixed_dictionaries(
        {'role': st.sampled_from(['system', 'developer', 'user', 'assistant', 'tool'])},
        optional={
            'content': TEXT | st.none() | st.lists(part, max_size=2),
            'tool_calls': st.lists(call, max_size=2),
            'tool_call_id': TEXT,
        },
    )
    function = st.fixed_dictionaries({'name': TEXT}, optional={'parameters': ANY_JSON})
    tool = st.fixed_dictionaries({'type': st.just('function'), 'function': function})
    return _openai_body(
        models,
        {'messages': st.lists(message, min_size=1, max_size=3)},
        {
            'tools': st.lists(tool, max_size=2),
            'tool_choice': st.sampled_from(['none', 'auto', 'required'])
            | st.fixed_dictionaries({'type': st.just('function'), 'function': st.fixed_dictionaries({'name': TEXT})}),
            'logprobs': st.booleans(),
            'top_logprobs': st.integers(-1, 25),
            'max_completion_tokens': SMALL_MAX_TOKENS | EXTREME_NUMBERS,
            'response_format': st.fixed_dictionaries({'type': st.sampled_from(['text', 'json_object'])}),
            'chat_template_kwargs': st.dictionaries(st.sampled_from(['tokenize', 'enable_thinking']) | TEXT, ANY_JSON),
        },
    )


def openai_completion_body(models: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """`POST /v1/completions` bodies: text, token-id and batched prompts (ids inside and outside the vocabulary)."""
    ids = st.lists(st.integers(-3, 5000) | EXTREME_NUMBERS.filter(lambda v: isinstance(v, int)), max_size=8)
    return _openai_body(
        models,
        {'prompt': TEXT | st.lists(TEXT, max_size=3) | ids | st.lists(ids, max_size=3)},
        {'logprobs': st.integers(-1, 25), 'echo': st.booleans(), 'best_of': st.integers(0, 3), 'suffix': TEXT},
    )


# ---- sessions, futures and weight operations (tinker/routes_service.py, routes_futures.py, routes_checkpoints.py) ----
def retrieve_futures_body(ids: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """`POST /api/v1/retrieve_futures` bodies (`FuturesRetrieveRequest`, bent). The route long-polls for up to the
    server's `long_poll_s` when a body names no `timeout`, so every object body gets a short one (the fuzzer's answer
    deadline is the long poll itself)."""
    from tinker import types

    def short(body: Any) -> Any:
        if isinstance(body, dict):
            timeout = body.get('timeout')
            if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not -1 <= timeout <= 0.5:
                return {**body, 'timeout': 0.2}
        return body

    return bent(from_json_schema(types.FuturesRetrieveRequest.model_json_schema(), ids)).map(short)


#: `PUT .../checkpoints/{checkpoint_id}/ttl` bodies: `{ttl_seconds}` in and out of range, and anything else
TTL_BODY = st.fixed_dictionaries({'ttl_seconds': st.none() | st.integers(-5, 4000) | EXTREME_NUMBERS}) | ANY_JSON

#: the query of a signed checkpoint-file URL (`GET /api/v1/checkpoint_files/{file}`): forged, partial, extreme
CHECKPOINT_FILE_QUERY: dict[str, st.SearchStrategy[Any]] = {
    'run_id': TEXT,
    'checkpoint_id': TEXT | st.sampled_from(['external_weights/x', 'weights/x']),
    'owner': st.sampled_from(['alice', 'bob']) | TEXT,
    'reader': st.sampled_from(['alice', 'bob']) | TEXT,
    'expires': st.integers(-2, 2**40) | EXTREME_NUMBERS,
    'sig': st.text(alphabet='0123456789abcdef', min_size=64, max_size=64) | TEXT,
}
