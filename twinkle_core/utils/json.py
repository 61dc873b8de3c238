"""JSON-ready values: one conversion for everything twinkle writes as JSON (call results, client arguments,
adapter configs, log context). Pure Python: no torch or numpy import (twinkle-client uses it too).
"""

from __future__ import annotations

import enum
from typing import Any, Callable


def to_json(
    value: Any,
    *,
    exclude_none: bool = False,
    default: Callable[[Any], Any] = str,
    pack: Callable[[Any], Any] | None = None,
) -> Any:
    """A JSON-ready copy of `value`.

    Enums become their value; None, bools, numbers and strings stay; dict keys become strings; lists, tuples
    and sets become lists (sets sorted); pydantic models their `model_dump()`; objects with ``to_dict()``
    (peft configs) that dict; tensors and arrays their ``tolist()``, or ``pack(value)`` when `pack` is given and
    returns something other than None (e.g. `twinkle_core.utils.arrays.pack_array`). Anything else is
    ``default(value)``: its text by default; pass a function that raises to refuse such values. `exclude_none`
    drops None fields of models and ``to_dict()`` objects.
    """

    def convert(v: Any) -> Any:
        return to_json(v, exclude_none=exclude_none, default=default, pack=pack)

    if isinstance(value, enum.Enum):
        return convert(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): convert(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [convert(v) for v in (sorted(value, key=str) if isinstance(value, (set, frozenset)) else value)]
    dump = getattr(value, 'model_dump', None)
    if callable(dump):
        return convert(dump(exclude_none=exclude_none))
    to_dict = getattr(value, 'to_dict', None)
    if callable(to_dict):
        return {k: v for k, v in convert(to_dict()).items() if not (exclude_none and v is None)}
    tolist = getattr(value, 'tolist', None)
    if callable(tolist):
        packed = pack(value) if pack is not None else None
        return tolist() if packed is None else packed
    return default(value)


def is_json_plain(value: Any) -> bool:
    """True when `value` is JSON data as it is: None, a string, number or bool, or lists/tuples and
    string-keyed dicts of those (what can be stored and read back unchanged, bar tuples becoming lists)."""
    return (
        value is None
        or isinstance(value, (str, int, float, bool))
        or (isinstance(value, (list, tuple)) and all(is_json_plain(v) for v in value))
        or (isinstance(value, dict) and all(isinstance(k, str) and is_json_plain(v) for k, v in value.items()))
    )
