"""Which slice of each global batch a data-parallel rank gets."""
from __future__ import annotations

import os
import sys
from typing import Any, Sequence

from twinkle_core.errors import InvalidInputError


def current_rank() -> int:
    """This process's global rank: torch.distributed when initialised, else ``$RANK``, else 0."""
    dist = sys.modules.get('torch.distributed')
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return int(os.environ.get('RANK', 0))


def data_shard_of(device_mesh: Any, rank: int | None) -> tuple[int, int]:
    """``(data_rank, data_world_size)`` of `rank` (default: `current_rank()`) in `device_mesh`.

    Ranks that differ only in tp/pp/cp coordinates share a data rank, hence the same rows.
    """
    rank = current_rank() if rank is None else rank
    return device_mesh.data_rank(rank), device_mesh.data_world_size


def shard_bounds(batch_len: int, data_rank: int, data_world_size: int) -> tuple[int, int]:
    """Contiguous ``[start, end)`` of a batch of `batch_len` rows for `data_rank`: sizes differ by at most one,
    lower ranks take the extra rows, and the shards of all ranks cover the batch exactly once."""
    if not 0 <= data_rank < data_world_size:
        raise InvalidInputError(f'data_rank={data_rank} is outside 0..{data_world_size - 1}.')
    base, extra = divmod(batch_len, data_world_size)
    start = data_rank * base + min(data_rank, extra)
    return start, start + base + (1 if data_rank < extra else 0)


def take_shard(batch: Sequence[Any], data_rank: int, data_world_size: int) -> list[Any]:
    start, end = shard_bounds(len(batch), data_rank, data_world_size)
    return list(batch[start:end])
