"""Float arrays in JSON bodies: an image row's ``pixel_values`` ([patches, dim] float32) travels as base64 bytes with
its dtype and shape instead of nested lists: about 4x smaller and exact.

    {"__ndarray__": "<base64 of the little-endian bytes, C order>", "dtype": "float32", "shape": [64, 1536]}

Only numpy floating-point arrays of two or more dimensions are packed; 1-D per-token fields (weights, advantages)
stay lists, as every consumer reads them. Packing is pure Python (duck-typed arrays: twinkle-client imports no
numpy); unpacking imports numpy.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

from twinkle_core.errors import InvalidInputError

ARRAY_KEY = '__ndarray__'
PACKED_DTYPES = ('float16', 'float32', 'float64')


def pack_array(value: Any) -> dict[str, Any] | None:
    """`value` in the packed form when it is a numpy float array with 2+ dimensions; None otherwise."""
    dtype, shape = getattr(value, 'dtype', None), getattr(value, 'shape', None)
    if type(value).__module__ != 'numpy' or dtype is None or shape is None:
        return None
    if getattr(dtype, 'name', None) not in PACKED_DTYPES or len(shape) < 2:
        return None
    data = value.astype(dtype.newbyteorder('<'), copy=False).tobytes()  # tobytes: C order, whatever the strides
    return {ARRAY_KEY: base64.b64encode(data).decode('ascii'), 'dtype': dtype.name, 'shape': [int(n) for n in shape]}


def unpack_arrays(value: Any, where: str = 'body') -> Any:
    """`value` with every packed array (at any depth of dicts and lists) as a numpy array; `InvalidInputError`
    naming the place of a malformed one (unknown dtype, bad base64, bytes that do not fill the shape)."""
    if isinstance(value, dict):
        if ARRAY_KEY in value:
            return _unpack(value, where)
        return {k: unpack_arrays(v, f'{where}.{k}') for k, v in value.items()}
    if isinstance(value, list):
        return [unpack_arrays(v, f'{where}[{i}]') if isinstance(v, (dict, list)) else v for i, v in enumerate(value)]
    return value


def _unpack(packed: dict[str, Any], where: str) -> Any:
    import numpy as np

    dtype, shape = packed.get('dtype'), packed.get('shape')
    if dtype not in PACKED_DTYPES:
        raise InvalidInputError(f'{where}: packed array dtype {dtype!r} is not one of {list(PACKED_DTYPES)}.')
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise InvalidInputError(f'{where}: packed array shape must be a list of non-negative integers, got {shape!r}.')
    try:
        data = base64.b64decode(str(packed[ARRAY_KEY]), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInputError(f'{where}: packed array data is not valid base64 ({exc}).') from None
    little = np.dtype(dtype).newbyteorder('<')
    count = math.prod(shape)
    if len(data) != count * little.itemsize:
        raise InvalidInputError(
            f'{where}: packed array has {len(data)} bytes; shape {shape} of {dtype} needs {count * little.itemsize}.'
        )
    return np.frombuffer(data, dtype=little).reshape(shape).astype(dtype)
