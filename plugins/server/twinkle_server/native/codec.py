"""JSON encoding of native call results (tensors and arrays become lists, pydantic models dicts)."""
from __future__ import annotations

from typing import Any


def jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    dump = getattr(value, 'model_dump', None)
    if callable(dump):
        return jsonable(dump())
    tolist = getattr(value, 'tolist', None)
    if callable(tolist):
        return tolist()
    return str(value)
