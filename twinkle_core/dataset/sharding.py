"""Which data shard a rank reads (the slicing rule itself is `twinkle_core.mesh.shard_bounds`)."""

from __future__ import annotations

import sys
from typing import Any

from twinkle_core.runtime.distributed import env_rank


def current_rank() -> int:
    """This process's global rank: torch.distributed when initialised, else ``$RANK``, else 0."""
    dist = sys.modules.get('torch.distributed')
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return env_rank()


def data_shard_of(device_mesh: Any, rank: int | None) -> tuple[int, int]:
    """``(data_rank, data_world_size)`` of `rank` (default: `current_rank()`) in `device_mesh`.

    Ranks that differ only in tp/pp/cp coordinates share a data rank, hence the same rows.
    """
    rank = current_rank() if rank is None else rank
    return device_mesh.data_rank(rank), device_mesh.data_world_size
