"""`twinkle_core.utils.json`: the one conversion to JSON-ready values (server results, client arguments,
adapter configs, log context)."""
from __future__ import annotations

import enum
import json

import pytest
from pydantic import BaseModel

from core_helpers import run_python
from twinkle_core.utils.json import is_json_plain, to_json


class Color(str, enum.Enum):
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
    value = {1: (Level.HIGH, Point(x=1)), 'cfg': Config(), 'arr': Array(), 'set': frozenset({3, 1, 2}),
             'other': object}
    out = to_json(value)
    assert out == {'1': [3, {'x': 1, 'label': None}],
                   'cfg': {'r': 8, 'targets': ['q_proj', 'v_proj'], 'task': 'red', 'dropout': None},
                   'arr': [[1, 2], [3, 4]], 'set': [1, 2, 3], 'other': str(object)}
    assert type(out['cfg']['task']) is str
    json.dumps(out)


def test_to_json_exclude_none_and_refusing_default() -> None:
    assert to_json([Point(x=1), Config()], exclude_none=True) == [
        {'x': 1}, {'r': 8, 'targets': ['q_proj', 'v_proj'], 'task': 'red'}]

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
