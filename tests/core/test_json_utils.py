"""`twinkle_core.utils.json`: the one conversion to JSON-ready values (server results, client arguments,
adapter configs, log context)."""

from __future__ import annotations

import enum
import json

import pytest
from core_helpers import run_python
from pydantic import BaseModel

from twinkle_core.utils.json import is_json_plain, to_json


class Color(str, enum.Enum):  # noqa: UP042 - the str-mixin form, as user code writes it
    RED = 'red'


class Level(enum.Enum):
    HIGH = 3


class Point(BaseModel):
    x: int
    label: str | None = None


class Config:  # like peft.LoraConfig
    def to_dict(self) -> dict:
        return {'r': 8, 'targets': {'v_proj', 'q_proj'}, 'task': Color.RED, 'dropout': None}


class Array:  # like a tensor / ndarray
    def tolist(self) -> list:
        return [[1, 2], [3, 4]]


def test_to_json_converts_every_known_shape() -> None:
    value = {1: (Level.HIGH, Point(x=1)), 'cfg': Config(), 'arr': Array(), 'set': frozenset({3, 1, 2}), 'other': object}
    out = to_json(value)
    assert out == {
        '1': [3, {'x': 1, 'label': None}],
        'cfg': {'r': 8, 'targets': ['q_proj', 'v_proj'], 'task': 'red', 'dropout': None},
        'arr': [[1, 2], [3, 4]],
        'set': [1, 2, 3],
        'other': str(object),
    }
    assert type(out['cfg']['task']) is str
    json.dumps(out)


def test_to_json_exclude_none_and_refusing_default() -> None:
    assert to_json([Point(x=1), Config()], exclude_none=True) == [
        {'x': 1},
        {'r': 8, 'targets': ['q_proj', 'v_proj'], 'task': 'red'},
    ]

    def refuse(value: object) -> None:
        raise TypeError(type(value).__name__)

    with pytest.raises(TypeError, match='object'):
        to_json({'a': [object()]}, default=refuse)


def test_is_json_plain() -> None:
    assert is_json_plain({'a': [1, 2.0, None, True, ('x',)], 'b': {'c': 'd'}})
    assert not is_json_plain({1: 'a'}) and not is_json_plain([object()]) and not is_json_plain({'a': {1, 2}})


def test_module_is_torch_free() -> None:  # twinkle-client imports it and must not pull in torch
    out = run_python('import sys, twinkle_core.utils.json; print(sorted({"torch", "numpy"} & set(sys.modules)))')
    assert out.returncode == 0 and out.stdout.strip() == '[]', out.stderr


# ---- twinkle_core.utils.arrays: float arrays as base64 in JSON bodies (image rows of the native client) ----------
def test_float_arrays_pack_to_base64_and_back_exactly() -> None:
    np = pytest.importorskip('numpy')
    from twinkle_core.utils.arrays import ARRAY_KEY, pack_array, unpack_arrays

    pixels = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)
    rows = [
        {'input_ids': [1, 2], 'pixel_values': pixels, 'weights': np.ones(2, np.float32), 'grid': np.array([[1, 2, 3]])},
        {'pixel_values': pixels.T.astype('>f8')},
    ]  # non-contiguous and big-endian: still exact
    body = json.loads(json.dumps(to_json(rows, pack=pack_array)))
    assert body[0]['pixel_values'][ARRAY_KEY] and body[0]['pixel_values']['shape'] == [6, 5]
    assert body[0]['weights'] == [1.0, 1.0] and body[0]['grid'] == [[1, 2, 3]]  # 1-D and integer arrays: lists
    back = unpack_arrays(body)
    assert back[0]['pixel_values'].dtype == np.float32 and np.array_equal(back[0]['pixel_values'], pixels)
    assert back[1]['pixel_values'].dtype == np.float64 and np.array_equal(back[1]['pixel_values'], pixels.T)
    assert back[0]['input_ids'] == [1, 2]


@pytest.mark.parametrize(
    'packed,match',
    [
        ({'dtype': 'int64', 'shape': [1, 1]}, 'dtype'),
        ({'dtype': 'float32', 'shape': [1, -1]}, 'shape'),
        ({'dtype': 'float32', 'shape': [2, 2], '__ndarray__': '!!!'}, 'base64'),
        ({'dtype': 'float32', 'shape': [2, 2], '__ndarray__': 'AAAAAA=='}, 'needs 16'),
    ],
)
def test_malformed_packed_arrays_are_refused(packed: dict, match: str) -> None:
    pytest.importorskip('numpy')
    from twinkle_core.errors import InvalidInputError
    from twinkle_core.utils.arrays import unpack_arrays

    with pytest.raises(InvalidInputError, match=match):
        unpack_arrays({'rows': [{'pixel_values': {'__ndarray__': 'AAAA', **packed}}]})


def test_arrays_module_is_numpy_free_to_import() -> None:  # twinkle-client packs without numpy imported
    out = run_python('import sys, twinkle_core.utils.arrays; print(sorted({"torch", "numpy"} & set(sys.modules)))')
    assert out.returncode == 0 and out.stdout.strip() == '[]', out.stderr
