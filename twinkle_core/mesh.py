"""DeviceMesh (how ranks are arranged into parallel dimensions) and DeviceGroup (a named set of ranks).

Dimensions, outermost first: ``pp, dp, fsdp, cp, tp`` (tp innermost, so tensor-parallel peers are neighbours).
``cp`` (context / sequence parallel; ``sp_size`` is the same dimension) splits every sequence across its ranks,
which see the same rows: Megatron's context parallelism, Ulysses on the Transformers backend.
``ep`` (expert parallel) is folded over the data-parallel ranks: it must divide ``dp * fsdp``.
Pure Python: no torch import until `to_torch()`.

Data-parallel slicing lives here too, the one rule every runtime and loader follows: a batch is cut into
`data_world_size` contiguous slices whose sizes differ by at most one, lower data ranks taking the extra rows
(`shard_bounds`, `split_for_dp`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from twinkle_core.errors import MeshError

DIMS: tuple[str, ...] = ('pp', 'dp', 'fsdp', 'cp', 'tp')
_ALIASES = {'gpu': 'cuda'}  # the Twinkle documents write DeviceGroup(device_type='GPU')


def device_type_of(value: str | None) -> str:
    """A torch device type: `value` lower-cased ('GPU'/'gpu' -> 'cuda'), or when None what this machine has
    (CUDA when available, else CPU)."""
    if value is None:
        import torch

        return 'cuda' if torch.cuda.is_available() else 'cpu'
    if not isinstance(value, str) or not value:
        raise MeshError(f'device_type must be a device type such as "cpu" or "cuda", got {value!r}.')
    return _ALIASES.get(value.lower(), value.lower())


@dataclass(frozen=True)
class DeviceMesh:
    """A mesh of `world_size` ranks. Build it with `DeviceMesh.from_sizes(...)`."""

    sizes: dict[str, int]
    ep_size: int = 1
    device_type: str | None = None  # default: CUDA when available, else CPU (`device_type_of`)

    def __post_init__(self) -> None:
        object.__setattr__(self, 'device_type', device_type_of(self.device_type))

    @classmethod
    def from_sizes(
        cls,
        *,
        dp_size: int | None = None,
        fsdp_size: int = 1,
        tp_size: int = 1,
        pp_size: int = 1,
        cp_size: int = 1,
        ep_size: int = 1,
        world_size: int | None = None,
        device_type: str | None = None,
        sp_size: int | None = None,
    ) -> DeviceMesh:
        """Sizes default to 1; `dp_size=None` with `world_size` given takes whatever ranks are left over.
        `sp_size`: another name for `cp_size` (sequence parallelism). `device_type`: default CUDA when
        available, else CPU; 'GPU' means 'cuda'."""
        if sp_size is not None:
            if cp_size not in (1, sp_size):
                raise MeshError(f'sp_size={sp_size} and cp_size={cp_size} name the same dimension; give one.')
            cp_size = sp_size
        fixed = {'pp': pp_size, 'fsdp': fsdp_size, 'cp': cp_size, 'tp': tp_size}
        for name, size in {**fixed, 'ep': ep_size}.items():
            if not isinstance(size, int) or size < 1:
                raise MeshError(f'{name}_size must be a positive integer, got {size!r}.')
        others = math.prod(fixed.values())
        if dp_size is None:
            if world_size is None:
                dp_size = 1
            elif world_size % others:
                raise MeshError(f'world_size={world_size} is not divisible by pp*fsdp*cp*tp={others}.')
            else:
                dp_size = world_size // others
        if not isinstance(dp_size, int) or dp_size < 1:
            raise MeshError(f'dp_size must be a positive integer, got {dp_size!r}.')
        total = dp_size * others
        if world_size is not None and world_size != total:
            raise MeshError(
                f'world_size={world_size} but pp*dp*fsdp*cp*tp = {pp_size}*{dp_size}*{fsdp_size}*'
                f'{cp_size}*{tp_size} = {total}.'
            )
        if (dp_size * fsdp_size) % ep_size:
            raise MeshError(f'ep_size={ep_size} must divide dp_size*fsdp_size={dp_size * fsdp_size}.')
        sizes = {'pp': pp_size, 'dp': dp_size, 'fsdp': fsdp_size, 'cp': cp_size, 'tp': tp_size}
        return cls(sizes=sizes, ep_size=ep_size, device_type=device_type)

    # ---- shape -------------------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return math.prod(self.sizes.values())

    def size(self, dim: str) -> int:
        self._check_dim(dim)
        return self.sizes[dim]

    @property
    def data_world_size(self) -> int:
        """Ranks that see different data: dp * fsdp."""
        return self.sizes['dp'] * self.sizes['fsdp']

    # ---- rank <-> coordinate -----------------------------------------------------------------------------------
    def coordinate(self, rank: int) -> dict[str, int]:
        self._check_rank(rank)
        coord, rest = {}, rank
        for dim in reversed(DIMS):
            rest, coord[dim] = divmod(rest, self.sizes[dim])
        return {d: coord[d] for d in DIMS}

    def rank_of(self, **coord: int) -> int:
        rank = 0
        for dim in DIMS:
            c = coord.get(dim, 0)
            if not 0 <= c < self.sizes[dim]:
                raise MeshError(f'coordinate {dim}={c} is outside 0..{self.sizes[dim] - 1}.')
            rank = rank * self.sizes[dim] + c
        unknown = set(coord) - set(DIMS)
        if unknown:
            raise MeshError(f'unknown mesh dimension(s) {sorted(unknown)}; dimensions are {DIMS}.')
        return rank

    def data_rank(self, rank: int) -> int:
        """Index of `rank`'s data shard in 0..data_world_size-1."""
        c = self.coordinate(rank)
        return c['dp'] * self.sizes['fsdp'] + c['fsdp']

    def group_ranks(self, dims: str | tuple[str, ...], rank: int) -> list[int]:
        """Ranks that share every coordinate with `rank` except along `dims` (e.g. its tp group)."""
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        for d in dims:
            self._check_dim(d)
        base = self.coordinate(rank)
        out = []
        for r in range(self.world_size):
            c = self.coordinate(r)
            if all(c[d] == base[d] for d in DIMS if d not in dims):
                out.append(r)
        return out

    def all_groups(self, dims: str | tuple[str, ...]) -> list[list[int]]:
        """Every group along `dims` (each rank appears in exactly one)."""
        seen: set[int] = set()
        groups = []
        for r in range(self.world_size):
            if r not in seen:
                g = self.group_ranks(dims, r)
                seen.update(g)
                groups.append(g)
        return groups

    def is_data_leader(self, rank: int) -> bool:
        """True for the one rank per data shard that reports results (pp/cp/tp coordinate 0)."""
        c = self.coordinate(rank)
        return c['pp'] == c['cp'] == c['tp'] == 0

    def to_torch(self) -> Any:
        """A `torch.distributed.DeviceMesh` over the non-trivial dimensions (requires an initialised process group)."""
        from torch.distributed.device_mesh import init_device_mesh

        assert self.device_type is not None  # resolved by __post_init__
        dims = [d for d in DIMS if self.sizes[d] > 1] or ['dp']
        return init_device_mesh(self.device_type, tuple(self.sizes[d] for d in dims), mesh_dim_names=tuple(dims))

    def _check_dim(self, dim: str) -> None:
        if dim not in DIMS:
            raise MeshError(f'unknown mesh dimension {dim!r}; dimensions are {DIMS}.')

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise MeshError(f'rank {rank} is outside 0..{self.world_size - 1} (world_size={self.world_size}).')

    def __repr__(self) -> str:
        dims = ', '.join(f'{d}={s}' for d, s in {**self.sizes, 'ep': self.ep_size}.items() if s > 1) or 'single'
        return f'DeviceMesh({dims}, world_size={self.world_size}, device_type={self.device_type!r})'


@dataclass(frozen=True)
class DeviceGroup:
    """A named group of ranks (e.g. 'model' on ranks 0-1, 'sampler' on rank 2) of one device type."""

    name: str
    ranks: list[int] | int
    device_type: str | None = None  # default: CUDA when available, else CPU; 'GPU' means 'cuda'
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise MeshError('a DeviceGroup needs a name.')
        object.__setattr__(self, 'device_type', device_type_of(self.device_type))
        ranks = list(range(self.ranks)) if isinstance(self.ranks, int) else list(self.ranks)
        if not ranks or len(set(ranks)) != len(ranks) or min(ranks) < 0:
            raise MeshError(f'DeviceGroup {self.name!r}: ranks must be distinct non-negative ints, got {self.ranks!r}.')
        object.__setattr__(self, 'ranks', ranks)

    @property
    def world_size(self) -> int:
        assert isinstance(self.ranks, list)  # an int is expanded to its ranks by __post_init__
        return len(self.ranks)


# ---- data-parallel slicing -------------------------------------------------------------------------------------
def shard_bounds(num_rows: int, data_rank: int, data_world_size: int) -> tuple[int, int]:
    """Contiguous ``[start, end)`` of a batch of `num_rows` rows for `data_rank`: sizes differ by at most one,
    lower ranks take the extra rows, and the shards of all ranks cover the batch exactly once."""
    if data_world_size < 1:
        raise MeshError(f'data_world_size must be >= 1, got {data_world_size}.')
    if not 0 <= data_rank < data_world_size:
        raise MeshError(f'data_rank={data_rank} is outside 0..{data_world_size - 1}.')
    base, extra = divmod(num_rows, data_world_size)
    start = data_rank * base + min(data_rank, extra)
    return start, start + base + (1 if data_rank < extra else 0)


def split_for_dp(rows: Sequence[Any], data_world_size: int) -> list[list[Any]]:
    """`rows` cut into `data_world_size` slices by `shard_bounds` (data rank r gets slice r)."""
    if data_world_size < 1:
        raise MeshError(f'data_world_size must be >= 1, got {data_world_size}.')
    return [list(rows[slice(*shard_bounds(len(rows), r, data_world_size))]) for r in range(data_world_size)]
