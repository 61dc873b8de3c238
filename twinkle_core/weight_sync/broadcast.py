"""`BroadcastCheckpointEngine`: weights from one process to others over `torch.distributed` broadcast.

gloo on CPU, NCCL on GPUs. One update streams: a JSON preamble (the sender's metadata), then per bucket a JSON
header (label, names, dtypes, shapes) and one flat uint8 payload, then an end marker. A bucket given to `send`
is re-cut at `bucket_bytes` (one tensor larger than that travels alone). Neither side needs more than one bucket
at a time: the sender may produce buckets lazily (e.g. gathering shards layer by layer), and receivers allocate
one payload at a time and hand out views into it.

    # sender (rank 0)                                     # every receiver (rank 1..n)
    engine = BroadcastCheckpointEngine(                   engine = BroadcastCheckpointEngine(
        init_method='tcp://127.0.0.1:29555',                  init_method='tcp://127.0.0.1:29555',
        rank=0, world_size=2)                                 rank=1, world_size=2)
    engine.send([(BASE, list(model.state_dict().items()))])   for label, bucket in engine.receive().buckets: ...
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Iterable, Iterator

import torch
import torch.distributed as dist

from twinkle_core.errors import TwinkleError
from twinkle_core.weight_sync.base import CheckpointEngine, LabelledBucket, WeightUpdate
from twinkle_core.weight_sync.weights import bucketed

ALIGN = 64  # byte alignment of each tensor inside a bucket (any dtype view is valid there)


class BroadcastCheckpointEngine(CheckpointEngine):
    """`src`: the sending rank (global rank). `group`: a process group (default: the world). Pass
    `init_method`/`rank`/`world_size` to have the engine create (and later destroy) the default process group;
    `backend` defaults to NCCL when CUDA is available, gloo otherwise."""

    def __init__(
        self,
        *,
        src: int = 0,
        group: Any = None,
        bucket_bytes: int = 256 << 20,
        init_method: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        backend: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        if bucket_bytes < ALIGN:
            raise TwinkleError(f'bucket_bytes must be at least {ALIGN}, got {bucket_bytes}.')
        self._owns_group = False
        if init_method is not None:
            if dist.is_initialized():
                raise TwinkleError('torch.distributed is already initialised; pass group= instead of init_method=.')
            backend = backend or ('nccl' if torch.cuda.is_available() else 'gloo')
            dist.init_process_group(
                backend,
                init_method=init_method,
                rank=-1 if rank is None else rank,  # torch's defaults: from the init method / environment
                world_size=-1 if world_size is None else world_size,
                timeout=timedelta(seconds=timeout_s),
            )
            self._owns_group = True
        elif not dist.is_initialized():
            raise TwinkleError(
                'BroadcastCheckpointEngine needs torch.distributed: initialise a process group first '
                'or pass init_method=, rank= and world_size=.'
            )
        self.src, self.group, self.bucket_bytes = src, group, bucket_bytes
        self.device = _comm_device(dist.get_backend(group))

    @property
    def rank(self) -> int:
        return dist.get_rank()

    def send(self, buckets: Iterable[LabelledBucket], *, metadata: dict[str, Any] | None = None) -> None:
        if self.rank != self.src:
            raise TwinkleError(f'send() runs on the source rank {self.src}; this is rank {self.rank}.')
        self._broadcast_header({'metadata': metadata or {}})
        for label, bucket in buckets:
            for part in bucketed(((n, t.detach()) for n, t in bucket), self.bucket_bytes):
                entries = [[name, str(t.dtype).removeprefix('torch.'), list(t.shape)] for name, t in part]
                nbytes = sum(_padded_nbytes(t) for _, t in part)
                self._broadcast_header({'label': label, 'entries': entries, 'nbytes': nbytes})
                flat = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                offset = 0
                for _, t in part:
                    raw = t.contiguous().view(-1).view(torch.uint8)
                    flat[offset : offset + raw.numel()].copy_(raw)
                    offset += _padded_nbytes(t)
                dist.broadcast(flat, src=self.src, group=self.group)
        self._broadcast_header({'end': True})

    def receive(self) -> WeightUpdate:
        if self.rank == self.src:
            raise TwinkleError(f'receive() runs on receiving ranks; rank {self.src} is the sender.')
        preamble = self._broadcast_header(None)
        return WeightUpdate(self._stream(), preamble['metadata'])

    def close(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    # ---- internals -----------------------------------------------------------------------------------------
    def _stream(self) -> Iterator[LabelledBucket]:
        while True:
            header = self._broadcast_header(None)
            if header.get('end'):
                return
            flat = torch.empty(header['nbytes'], dtype=torch.uint8, device=self.device)
            dist.broadcast(flat, src=self.src, group=self.group)
            bucket, offset = [], 0
            for name, dtype_name, shape in header['entries']:
                dtype = getattr(torch, dtype_name)
                numel = 1
                for d in shape:
                    numel *= d
                size = numel * torch.empty((), dtype=dtype).element_size()
                bucket.append((name, flat[offset : offset + size].view(dtype).view(shape)))
                offset += _round_up(size)
            yield header['label'], bucket

    def _broadcast_header(self, header: dict[str, Any] | None) -> dict[str, Any]:
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        payload = json.dumps(header).encode() if header is not None else b''
        if header is not None:
            length[0] = len(payload)
        dist.broadcast(length, src=self.src, group=self.group)
        buf = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device)
            if header is not None
            else torch.empty(int(length.item()), dtype=torch.uint8, device=self.device)
        )
        dist.broadcast(buf, src=self.src, group=self.group)
        return header if header is not None else json.loads(buf.cpu().numpy().tobytes().decode())


def _comm_device(backend: str) -> torch.device:
    if backend == 'nccl':
        return torch.device('cuda', torch.cuda.current_device())
    return torch.device('cpu')


def _round_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _padded_nbytes(t: torch.Tensor) -> int:
    return _round_up(t.numel() * t.element_size())
