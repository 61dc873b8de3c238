"""Protobuf codecs of the Tinker wire format (the SDK's own `tinker_public_pb2`, so bytes stay compatible).

Decoding validates as it goes and raises `ApiError` 400/422 naming the datum and field that is wrong: a
malformed body, an image/audio chunk, a tensor whose length differs from the input's, an unknown dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

from twinkle_core.types import SampleResponse
from twinkle_server.errors import bad_request, unprocessable

_NP_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass
class WireDatum:
    tokens: list[int]
    inputs: dict[str, np.ndarray]  # loss_fn_inputs, flattened per datum


@dataclass
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_config: dict[str, Any]
    forward_only: bool
    data: list[WireDatum] = field(default_factory=list)


def parse_forward_backward(body: bytes) -> Any:
    """The raw `ForwardBackwardRequest` message (400 when the bytes are not one)."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise bad_request(f'forward_backward body is not a valid ForwardBackwardRequest protobuf: {exc}') from None
    if not msg.model_id:
        raise bad_request('forward_backward request has no model_id')
    return msg


def datum_lengths(msg: Any) -> list[int]:
    """Tokens of each datum's model input (int32 each) of a parsed request, counted without decoding them."""
    return [sum(len(chunk.encoded_text.tokens) // 4 for chunk in d.model_input
                if chunk.WhichOneof('chunk') == 'encoded_text') for d in msg.data]


def decode_forward_backward(msg: Any) -> ForwardBackwardCall:
    """Validate and convert a parsed request (422 naming the bad datum/field)."""
    config: dict[str, Any] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof('value') == 'text' else float(v.number)
    call = ForwardBackwardCall(msg.model_id, int(msg.seq_id), msg.loss_fn, config, bool(msg.forward_only))
    if not msg.data:
        raise unprocessable('forward_backward request has no data (send at least one Datum)')
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in d.model_input:
            kind = chunk.WhichOneof('chunk')
            if kind == 'encoded_text':
                tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype='<i4').tolist())
            else:
                raise unprocessable(f'datum {i}: only encoded_text chunks are supported by this server '
                                    f'(got {kind or "an empty chunk"}); send token ids')
        if not tokens:
            raise unprocessable(f'datum {i}: model_input has no tokens')
        inputs = {name: _tensor(t, f'datum {i} loss_fn_inputs[{name!r}]') for name, t in d.loss_fn_inputs.items()}
        for name, arr in inputs.items():
            if arr.shape[0] != len(tokens):
                raise unprocessable(f'datum {i}: loss_fn_inputs[{name!r}] has {arr.shape[0]} values but the model '
                                    f'input has {len(tokens)} tokens; every tensor needs one value per input token')
        call.data.append(WireDatum(tokens, inputs))
    return call


def _tensor(t: Any, where: str) -> np.ndarray:
    dtype = _NP_DTYPES.get(t.dtype)
    if dtype is None:
        raise unprocessable(f'{where}: unsupported dtype enum {t.dtype} (use float32 or int64)')
    shape = list(t.shape)
    try:
        if t.HasField('sparse_csr'):
            csr = t.sparse_csr
            values = np.frombuffer(csr.values, dtype=dtype)
            crow = np.frombuffer(csr.crow_indices, dtype='<i8')
            col = np.frombuffer(csr.col_indices, dtype='<i8')
            rows = len(crow) - 1
            cols = shape[1] if len(shape) > 1 else 1
            dense = np.zeros((rows, cols), dtype=dtype)
            for r in range(rows):
                dense[r, col[crow[r]:crow[r + 1]]] = values[crow[r]:crow[r + 1]]
            arr = dense if len(shape) > 1 else dense[:, 0]
        else:
            arr = np.frombuffer(t.dense, dtype=dtype)
            if shape:
                arr = arr.reshape(shape)
    except (ValueError, IndexError) as exc:
        raise unprocessable(f'{where}: tensor bytes do not match shape {shape}: {exc}') from None
    return arr


def encode_forward_backward_output(logprobs: list[list[float]], metrics: dict[str, float]) -> bytes:
    """`logprobs[i]`: per-token learner log-probs of datum i (one per input token)."""
    record = pb.ArrayRecord(num_datums=len(logprobs))
    _batched(record.fields['logprobs'], logprobs)
    out = pb.ForwardBackwardOutput(loss_fn_output_type='ArrayRecord', loss_fn_outputs=[record])
    for k, v in metrics.items():
        out.metrics[k] = float(v)
    return out.SerializeToString()


def _batched(bt: Any, per_datum: list[list[float]]) -> None:
    arrays = [np.asarray(x, dtype='<f4') for x in per_datum]
    offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype('<i8')
    bt.data = b''.join(a.tobytes() for a in arrays)
    bt.offsets = offsets.tobytes()
    bt.dtype = pb.DTYPE_FLOAT32


def encode_sample_response(resp: SampleResponse) -> bytes:
    out = pb.SampleResponse()
    for seq in resp.sequences:
        s = out.sequences.add()
        s.stop_reason = pb.STOP_REASON_STOP if seq.stop_reason == 'stop' else pb.STOP_REASON_LENGTH
        s.tokens = np.asarray(seq.tokens, dtype='<i4').tobytes()
        s.logprobs = np.asarray(seq.logprobs or [0.0] * len(seq.tokens), dtype='<f4').tobytes()
    if resp.prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray([np.nan if x is None else x for x in resp.prompt_logprobs],
                                         dtype='<f4').tobytes()
    return out.SerializeToString()
