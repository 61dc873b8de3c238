"""Protobuf codecs of the Tinker wire format (the SDK's own `tinker_public_pb2`, so bytes stay compatible).

Decoding validates as it goes and raises `ApiError` 400/422 naming the datum and field that is wrong: a
malformed body, an audio or empty chunk, an unknown dtype, a tensor whose length differs from the input's. Image
chunks are kept as `WireImage`s: `service.images` sizes and decodes them, and the tensors of a datum with images are
checked against its expanded length by `tinker.datums`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tinker.proto import tinker_public_pb2 as pb

from twinkle_core.types import SampleResponse
from twinkle_server.errors import bad_request, over_limit, unprocessable
from twinkle_server.service.images import Chunk, WireImage, declared_length

_NP_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass(frozen=True)
class Span:
    """One provenance claim (`Datum.with_provenance`): a run of `length` positions is positions
    ``[offset, offset + length)`` of sequence `sequence_id`'s sampled tokens (`sampled`) or request prompt."""

    sampled: bool
    sequence_id: str
    offset: int
    length: int


@dataclass
class WireDatum:
    chunks: list[Chunk]  # the model input: token-id runs and images, in order
    inputs: dict[str, np.ndarray]  # loss_fn_inputs, flattened per datum
    #: provenance (`tinker.stability`): runs tiling the input tokens / target_tokens, or None (both or neither)
    model_input_spans: list[Span] | None = None
    loss_fn_input_spans: list[Span] | None = None

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
        if 'target_tokens' in inputs and inputs['target_tokens'].ndim == 0:  # one target, sent without a shape
            inputs['target_tokens'] = inputs['target_tokens'].reshape(1)
        datum = WireDatum(chunks, inputs, *_provenance(d, f'datum {i}'))
        if not datum.has_images:  # image inputs are checked once the server has sized their images
            check_lengths(datum.inputs, declared_length(chunks), f'datum {i}')
        call.data.append(datum)
    return call


def _provenance(d: Any, where: str) -> tuple[list[Span] | None, list[Span] | None]:
    """A datum's provenance spans (None, None when it has none); 422 for a half-set pair or an empty span."""
    if not d.model_input_spans and not d.loss_fn_input_spans:
        return None, None
    if not d.model_input_spans or not d.loss_fn_input_spans:
        raise unprocessable(f'{where}: provenance comes as a pair: set model_input_spans and loss_fn_input_spans')
    out = []
    for field_name in ('model_input_spans', 'loss_fn_input_spans'):
        spans = []
        for k, span in enumerate(getattr(d, field_name)):
            arm = span.WhichOneof('span')
            if arm is None:
                raise unprocessable(f'{where} {field_name}[{k}]: a span must be prompt_tokens or sampled_tokens')
            run = getattr(span, arm)
            if not run.sequence_id or run.offset < 0 or run.length < 0:
                raise unprocessable(f'{where} {field_name}[{k}]: needs a sequence_id, offset >= 0 and length >= 0')
            spans.append(Span(arm == 'sampled_tokens', run.sequence_id, int(run.offset), int(run.length)))
        out.append(spans)
    return out[0], out[1]


def check_lengths(inputs: dict[str, np.ndarray], length: int, where: str) -> None:
    """Every loss_fn_input but a scalar (a custom loss's rank-0 input) has one value (or row) per input position (a
    422 naming the first that has not)."""
    for name, arr in inputs.items():
        if arr.ndim and arr.shape[0] != length:
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
            if shape or arr.size == 1:  # no shape: 1-D, or a scalar (shape [], what the SDK sends for a 0-d tensor)
                arr = arr.reshape(shape)
    except (ValueError, IndexError) as exc:
        raise unprocessable(f'{where}: tensor bytes do not match shape {shape}: {exc}') from None
    return arr


def encode_forward_backward_output(logprobs: list[Any], metrics: dict[str, float]) -> bytes:
    """`logprobs[i]`: learner log-probs of datum i, [N] (one per input token) or [N, K] (one per candidate of 2-D
    `target_tokens`). Consecutive datums of one trailing shape share an `ArrayRecord` (the SDK reads each record's
    `trailing_shape`, so widths may differ between records)."""
    arrays = [np.asarray(x, dtype='<f4') for x in logprobs]
    out = pb.ForwardBackwardOutput(loss_fn_output_type='ArrayRecord')
    start = 0
    while start < len(arrays) or not out.loss_fn_outputs:
        trailing = arrays[start].shape[1:] if arrays else ()
        stop = start + 1
        while stop < len(arrays) and arrays[stop].shape[1:] == trailing:
            stop += 1
        record = out.loss_fn_outputs.add(num_datums=stop - start if arrays else 0)
        _batched(record.fields['logprobs'], arrays[start:stop], trailing)
        start = stop
    for k, v in metrics.items():
        out.metrics[k] = float(v)
    return out.SerializeToString()


def _batched(bt: Any, arrays: list[np.ndarray], trailing: tuple[int, ...]) -> None:
    offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype('<i8')
    bt.data = b''.join(a.tobytes() for a in arrays)
    bt.offsets = offsets.tobytes()
    bt.dtype = pb.DTYPE_FLOAT32
    bt.trailing_shape.extend(trailing)


#: an empty top-k cell (`tinker.types.topk_logprobs`: token 0, log-prob -99999.0; a row of them reads as None)
TOPK_EMPTY_TOKEN, TOPK_EMPTY_LOGPROB = 0, -99999.0


@dataclass(frozen=True)
class TargetIds:
    """A request's `target_prompt_logprobs`: dense ids [len(prompt) - 1, K] (-1 = no id) and, when it came as sparse
    CSR, its row pointers and column indices (the response uses the same layout)."""

    ids: np.ndarray
    crow: np.ndarray | None = None
    col: np.ndarray | None = None


@dataclass(frozen=True)
class ScoreShapes:
    """What a sample request asked for beyond tokens and log-probs, as the response must lay it out: top-k widths
    (fixed per response; missing cells are filled with the SDK's sentinel), alt draws per position, target ids."""

    topk_sample: int = 0
    topk_prompt: int = 0
    alt_k: int = 0
    targets: TargetIds | None = None


def decode_target_ids(td: Any, max_cells: int | None) -> TargetIds:
    """The SDK's `TensorData` of `target_prompt_logprobs` (int64, 2-D, dense or CSR) as `TargetIds` (400 when
    malformed; 400 when its dense size exceeds `max_cells`, checked before it is built)."""
    if td.dtype != 'int64':
        raise bad_request(f'target_prompt_logprobs must be an int64 tensor of token ids, got {td.dtype}')
    shape = list(td.shape or [])
    if len(shape) != 2 or min(shape) < 0:
        raise bad_request(f'target_prompt_logprobs must be 2-D, [len(prompt) - 1, K], got shape {td.shape}')
    rows, cols = shape
    if max_cells is not None and rows * cols > max_cells:
        raise over_limit(
            'max_prompt_logprob_cells', max_cells, f'{rows} x {cols}', 'target_prompt_logprobs cells', status=400
        )
    try:
        data = np.asarray(td.data, dtype=np.int64)
    except (OverflowError, ValueError, TypeError):
        raise bad_request('target_prompt_logprobs data must be integer token ids') from None
    if td.sparse_crow_indices is None and td.sparse_col_indices is None:
        if data.size != rows * cols:
            raise bad_request(f'target_prompt_logprobs has {data.size} values for shape {shape}')
        ids, crow, col = data.reshape(rows, cols), None, None
    else:
        crow = np.asarray(td.sparse_crow_indices or [], dtype=np.int64)
        col = np.asarray(td.sparse_col_indices or [], dtype=np.int64)
        valid = (
            len(crow) == rows + 1
            and crow[0] == 0
            and crow[-1] == data.size == col.size
            and bool((np.diff(crow) >= 0).all())
            and bool(((col >= 0) & (col < cols)).all())
        )
        if not valid:
            raise bad_request(
                f'target_prompt_logprobs: malformed sparse CSR indices for shape {shape} (crow_indices need '
                f'{rows + 1} non-decreasing entries from 0 to the number of values; col_indices one per value, '
                f'each below {cols})'
            )
        ids = np.full((rows, cols), -1, dtype=np.int64)
        ids[np.repeat(np.arange(rows), np.diff(crow)), col] = data
    if (ids < -1).any():
        raise bad_request('target_prompt_logprobs holds ids below -1 (-1 marks a cell that requests nothing)')
    return TargetIds(ids, crow, col)


def encode_sample_response(resp: SampleResponse, shapes: ScoreShapes | None = None) -> bytes:
    shapes = shapes or ScoreShapes()
    out = pb.SampleResponse()
    for seq in resp.sequences:
        s = out.sequences.add()
        s.stop_reason = pb.STOP_REASON_STOP if seq.stop_reason == 'stop' else pb.STOP_REASON_LENGTH
        s.tokens = np.asarray(seq.tokens, dtype='<i4').tobytes()
        s.logprobs = np.asarray(seq.logprobs or [0.0] * len(seq.tokens), dtype='<f4').tobytes()
        if shapes.topk_sample:
            _topk(s.topk_sampled_logprobs, seq.top_logprobs or [None] * len(seq.tokens), shapes.topk_sample)
    if resp.prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(
            [np.nan if x is None else x for x in resp.prompt_logprobs], dtype='<f4'
        ).tobytes()
    if shapes.topk_prompt and resp.prompt_top_logprobs is not None:
        _topk(out.topk_prompt_logprobs, resp.prompt_top_logprobs, shapes.topk_prompt)
    if shapes.targets is not None and resp.prompt_target_logprobs is not None:
        _target_logprobs(out.target_prompt_logprobs, shapes.targets, resp.prompt_target_logprobs)
    if shapes.alt_k and resp.prompt_alt_tokens is not None:
        draws = resp.prompt_alt_tokens
        shape = [len(draws), shapes.alt_k]
        tokens = np.asarray([[t for t, _ in row] for row in draws], dtype='<i8').reshape(shape)
        logprobs = np.asarray([[lp for _, lp in row] for row in draws], dtype='<f4').reshape(shape)
        alt = out.prompt_alt_tokens
        alt.tokens.CopyFrom(pb.Tensor(dense=tokens.tobytes(), dtype=pb.DTYPE_INT64, shape=shape))
        alt.logprobs.CopyFrom(pb.Tensor(dense=logprobs.tobytes(), dtype=pb.DTYPE_FLOAT32, shape=shape))
    return out.SerializeToString()


def _topk(msg: Any, rows: list[Any], k: int) -> None:
    """Fill a `TopkLogprobs` message: one row of k (token, log-prob) per position, most likely first; a position
    without any (None) and the cells past a shorter list hold the SDK's empty sentinel."""
    token_ids = np.full((len(rows), k), TOPK_EMPTY_TOKEN, dtype='<i4')
    logprobs = np.full((len(rows), k), TOPK_EMPTY_LOGPROB, dtype='<f4')
    for i, row in enumerate(rows):
        for j, (token, logprob) in enumerate((row or [])[:k]):
            token_ids[i, j], logprobs[i, j] = token, logprob
    msg.k, msg.length = k, len(rows)
    msg.token_ids, msg.logprobs = token_ids.tobytes(), logprobs.tobytes()


def _target_logprobs(msg: Any, targets: TargetIds, values: list[list[float]]) -> None:
    """The log-probs of the requested ids in the request's own layout: dense [rows, K] (0.0 in -1 cells), or CSR
    with the request's indices (one value per listed cell)."""
    dense = np.asarray(values, dtype='<f4').reshape(targets.ids.shape)
    dense[targets.ids < 0] = 0.0
    msg.dtype = pb.DTYPE_FLOAT32
    msg.shape.extend(targets.ids.shape)
    if targets.crow is None or targets.col is None:
        msg.dense = dense.tobytes()
        return
    rows = np.repeat(np.arange(targets.ids.shape[0]), np.diff(targets.crow))
    msg.sparse_csr.values = dense[rows, targets.col].astype('<f4').tobytes()
    msg.sparse_csr.crow_indices = targets.crow.astype('<i8').tobytes()
    msg.sparse_csr.col_indices = targets.col.astype('<i8').tobytes()
