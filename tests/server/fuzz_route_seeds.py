"""The hand-written requests `test_fuzz_routes.py` replays before the drawn ones: the defects earlier hostile probes
found (`seed_requests`)."""

from __future__ import annotations

import struct
import zlib
from typing import Any

from fuzz_route_requests import Fuzz, Request
from raw_http import PROTO, fwdbwd_body
from tinker import types


def _tall_png() -> bytes:
    """A valid 1x40000 grayscale PNG (a few hundred bytes): an aspect ratio no vision processor accepts."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))

    rows = b'\x00\x00' * 40000
    return (
        b'\x89PNG\r\n\x1a\n'
        + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 40000, 8, 0, 0, 0, 0))
        + chunk(b'IDAT', zlib.compress(rows))
        + chunk(b'IEND', b'')
    )


def _hostile_graphs() -> list[list[Any]]:
    """Custom-loss graphs a traced loss never has: nesting past any limit, references that are not names, huge
    integers, a module call, thousands of nodes, an output that is not (loss, metrics)."""
    lp = {'op': 'placeholder', 'name': 'lp', 'target': 'logprobs'}
    out = {'op': 'output', 'name': 'output', 'target': 'output', 'args': [{'tuple': [{'ref': 'lp'}, {'dict': {}}]}]}
    deep: Any = 1
    for _ in range(200):
        deep = [deep]
    call = {'op': 'call_function', 'name': 'x', 'target': 'torch.exp'}
    return [
        [lp, {**call, 'args': [deep]}, out],
        [lp, {**call, 'args': [{'ref': ['lp']}]}, out],
        [lp, {**call, 'args': [{'ref': 'lp'}, 10**40]}, out],
        [lp, {'op': 'call_module', 'name': 'm', 'target': 'torch.nn.Linear'}, out],
        [lp, *({**call, 'name': f'x{i}', 'args': [{'ref': 'lp'}]} for i in range(5000)), out],
        [lp, {**out, 'args': [{'ref': 'lp'}]}],
        [lp, lp, out],
        [{**lp, 'name': 'lp; import os'}, out],
        [lp, {**call, 'args': [{'float': 'inf'}, {'dtype': 'complex128'}]}, out],
    ]


def _custom_loss_body(f: Fuzz, i: int, nodes: list[Any]) -> dict[str, Any]:
    return {
        'session_id': f.model.split(':')[0],
        'custom_loss_seq_id': 500 + i,
        'name': 'hostile',
        'inputs': [{'name': 'logprobs', 'rank': 1}],
        'graph': {'format': 1, 'nodes': nodes},
    }


def seed_requests(f: Fuzz) -> dict[tuple[str, str], list[Request]]:
    """The defects of earlier hostile probes, replayed on every run before the drawn requests."""
    tall = types.ModelInput(chunks=[types.ImageChunk(data=_tall_png(), format='png')])
    return {
        ('post', '/twinkle/v1/datasets'): [
            Request('POST', '/twinkle/v1/datasets', json={'meta': {'dataset_id_or_path': p}, 'steps': []})
            for p in ('hf://secretdir/.', 'ms://secretdir/.', 'hf://..', 'ms://a/../../b')
        ]
        + [
            Request(
                'POST',
                '/twinkle/v1/datasets',
                json={
                    'meta': {'dataset_id_or_path': 'hf://a/b', 'data_slice': {'start': 0, 'stop': 50_000_000}},
                    'steps': [],
                },
            )
        ],
        ('post', '/api/v1/create_custom_loss'): [
            Request('POST', '/api/v1/create_custom_loss', json=_custom_loss_body(f, i, nodes))
            for i, nodes in enumerate(_hostile_graphs())
        ],
        ('post', '/api/v1/optim_step'): [
            Request(
                'POST',
                '/api/v1/optim_step',
                json={'model_id': f.model, 'seq_id': 90 + i, 'adam_params': {'learning_rate': lr}},
            )
            for i, lr in enumerate((3e38, 1e300, -1e300, 1e-320))
        ],
        ('post', '/api/v1/forward_backward'): [
            Request(
                'POST',
                '/api/v1/forward_backward',
                headers=PROTO,
                content=fwdbwd_body(
                    f.model, 95, [types.Datum(model_input=tall, loss_fn_inputs={'target_tokens': [1]})]
                ),
            )
        ],
        ('post', '/api/v1/asample'): [
            Request(
                'POST',
                '/api/v1/asample',
                json={
                    'sampling_session_id': f.sampling_session,
                    'seq_id': 5,
                    'num_samples': 1,
                    'prompt': tall.model_dump(mode='json'),
                    'sampling_params': {'max_tokens': 2},
                },
            )
        ],
        ('post', '/api/v1/save_weights'): [
            Request('POST', '/api/v1/save_weights', json={'model_id': f.model, 'seq_id': 97, 'path': name})
            for name in ('', '   ', 'a\nb', 'a\x00b', '\x1b[31m')
        ],
        ('post', '/twinkle/v1/models/{model_id}/call/{method}'): [
            Request(
                'POST',
                f'/twinkle/v1/models/{f.native_model}/call/save',
                json={'args': ['ok'], 'kwargs': {'token': 'x', 'repo': 'y'}},
            ),
            Request(
                'POST',
                f'/twinkle/v1/models/{f.native_model}/call/set_template',
                json={'args': ['Template'], 'kwargs': {'model_id': 'secretdir'}},
            ),
        ],
    }
