"""Protobuf codecs of the Tinker wire format (the SDK's own `tinker_public_pb2`, so bytes stay compatible).

Decoding validates as it goes and raises `ApiError` 400/422 naming the datum and field that is wrong: a
malformed body, an audio or empty chunk, an unknown dtype, a tensor whose length differs from the input's. Image
chunks are kept as `WireImage`s: `tinker.images` sizes and decodes them, and the tensors of a datum with images are
checked against its expanded length by `tinker.datums`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

from twinkle_core.types import SampleResponse
from twinkle_server.errors import bad_request, unprocessable
from twinkle_server.tinker.images import Chunk, WireImage, declared_length

_NP_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass
class WireDatum:
    chunks: list[Chunk]  # the model input: token-id runs and images, in order
    inputs: dict[str, np.ndarray]  # loss_fn_inputs, flattened per datum

    @property
    def has_images(self) -> bool:
        return any(isinstance(c, WireImage) for c in self.chunks)


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
    """Positions of each datum's model input of a parsed request, counted without decoding it (tokens are int32;
    an image counts its expected_tokens, 0 when unset: the exact length is checked again once images are sized)."""
    return [
        sum(
            len(chunk.encoded_text.tokens) // 4
            if chunk.WhichOneof('chunk') == 'encoded_text'
            else chunk.image.expected_tokens
            if chunk.WhichOneof('chunk') == 'image'
            else 0
            for chunk in d.model_input
        )
        for d in msg.data
    ]


def decode_forward_backward(msg: Any) -> ForwardBackwardCall:
    """Validate and convert a parsed request (422 naming the bad datum/field)."""
    config: dict[str, Any] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof('value') == 'text' else float(v.number)
    call = ForwardBackwardCall(msg.model_id, int(msg.seq_id), msg.loss_fn, config, bool(msg.forward_only))
    if not msg.data:
        raise unprocessable('forward_backward request has no data (send at least one Datum)')
    for i, d in enumerate(msg.data):
        chunks = [_chunk(c, f'datum {i}: chunk {k}') for k, c in enumerate(d.model_input)]
        if not any(chunks):
            raise unprocessable(f'datum {i}: model_input has no tokens')
        inputs = {name: _tensor(t, f'datum {i} loss_fn_inputs[{name!r}]') for name, t in d.loss_fn_inputs.items()}
        datum = WireDatum(chunks, inputs)
        if not datum.has_images:  # image inputs are checked once the server has sized their images
            check_lengths(datum.inputs, declared_length(chunks), f'datum {i}')
        call.data.append(datum)
    return call


def check_lengths(inputs: dict[str, np.ndarray], length: int, where: str) -> None:
    """Every loss_fn_input has one value per input position (a 422 naming the first that has not)."""
    for name, arr in inputs.items():
        if arr.shape[0] != length:
            raise unprocessable(
                f'{where}: loss_fn_inputs[{name!r}] has {arr.shape[0]} values but the model input '
                f'has {length} tokens; every tensor needs one value per input token (an image '
                f'counts as its number of image tokens)'
            )


def _chunk(chunk: Any, where: str) -> Chunk:
    kind = chunk.WhichOneof('chunk')
    if kind == 'encoded_text':
        return np.frombuffer(chunk.encoded_text.tokens, dtype='<i4').tolist()
    if kind == 'image':
        img = chunk.image
        if img.HasField('override_dimensions'):
            raise bad_request(f'{where}: image override_dimensions is not supported; resize the image client-side')
        return WireImage(img.data, img.format, img.expected_tokens if img.HasField('expected_tokens') else None)
    raise unprocessable(
        f'{where}: {kind or "empty"} chunks are not supported by this server; send encoded_text '
        f'(token ids) and image chunks'
    )


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
                dense[r, col[crow[r] : crow[r + 1]]] = values[crow[r] : crow[r + 1]]
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
        out.prompt_logprobs = np.asarray(
            [np.nan if x is None else x for x in resp.prompt_logprobs], dtype='<f4'
        ).tobytes()
    return out.SerializeToString()
