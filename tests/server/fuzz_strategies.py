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
