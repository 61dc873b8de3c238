"""`DataLoader`: global batches of rows, seeded shuffling per epoch, exact resume, data-parallel sharding.

Pure Python (no torch). Works over anything with ``__len__`` and ``__getitem__`` (a `Dataset`, a Hugging Face
dataset, a list); a `Dataset`'s ``rows(indices)`` is used to read a batch in one go.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Iterator

from twinkle_core.dataset.sharding import data_shard_of
from twinkle_core.dispatch import remote_method
from twinkle_core.errors import InvalidInputError
from twinkle_core.mesh import shard_bounds
from twinkle_core.runtime.context import HostedComponentMeta, global_device_mesh

STATE_VERSION = 1


class DataLoader(metaclass=HostedComponentMeta):
    """Iterates one epoch of batches; each batch is a list of row dicts (or ``collate(rows)`` when given).

    - `batch_size` is the **global** batch size. Sharded (``device_mesh=...`` or `shard`), every data-parallel
      rank gets its contiguous slice of each global batch; the slices of all ranks make up the global batch.
    - Order: dataset order, or when ``shuffle=True`` a permutation seeded by ``seed + epoch`` — the same on every
      rank and every run.
    - The last batch of an epoch is dropped when ``drop_last`` and it is short, or when it has fewer than
      `min_batch_size` rows. Sharded, `min_batch_size` defaults to the number of data ranks, so that no rank
      ever gets an empty batch.
    - Epochs: a loop yields the rest of the current epoch; when it runs to the end the loader moves on to the
      next epoch (new shuffle). Breaking out of a loop keeps the position: the next loop continues there (and
      yields nothing if the epoch's last batch had been taken). `set_epoch(e)` jumps to the start of epoch `e`.
    - `dataset` may be a function that builds the dataset (called once here: on a remote group, inside it).
    - `state_dict()` records epoch and position; `load_state_dict()` on a loader over the same data resumes with
      exactly the batches that had not been yielded yet, in the same order.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        min_batch_size: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        collate: Callable[[list[dict[str, Any]]], Any] | None = None,
        device_mesh: Any = None,
        rank: int | None = None,
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInputError(f'batch_size must be a positive integer, got {batch_size!r}.')
        if min_batch_size is not None and not 1 <= min_batch_size <= batch_size:
            raise InvalidInputError(
                f'min_batch_size must be between 1 and batch_size={batch_size}, got {min_batch_size!r}.'
            )
        if callable(dataset) and not hasattr(dataset, '__len__'):
            dataset = dataset()  # a factory (the Twinkle documents' form): built here, inside the remote group
        self.dataset, self.batch_size = dataset, batch_size
        self.shuffle, self.seed, self.drop_last, self.collate = shuffle, seed, drop_last, collate
        self._min_batch_size = min_batch_size
        self.data_rank, self.data_world_size = 0, 1
        self.epoch, self._position = 0, 0  # position = batches of this epoch already yielded
        device_mesh = device_mesh if device_mesh is not None else global_device_mesh()  # torchrun / Ray workers
        if device_mesh is not None:
            self.shard(*data_shard_of(device_mesh, rank))

    # ---- configuration -----------------------------------------------------------------------------------------
    def shard(self, data_rank: int, data_world_size: int) -> DataLoader:
        """Yield only this rank's slice of every global batch."""
        if not isinstance(data_world_size, int) or data_world_size < 1:
            raise InvalidInputError(f'data_world_size must be a positive integer, got {data_world_size!r}.')
        if not 0 <= data_rank < data_world_size:
            raise InvalidInputError(f'data_rank={data_rank} is outside 0..{data_world_size - 1}.')
        if data_world_size > self.batch_size:
            raise InvalidInputError(
                f'batch_size={self.batch_size} (global) is smaller than the number of data '
                f'ranks {data_world_size}: some ranks would get no rows.'
            )
        if self._min_batch_size is not None and self._min_batch_size < data_world_size and not self.drop_last:
            raise InvalidInputError(
                f'min_batch_size={self._min_batch_size} is smaller than the number of data '
                f'ranks {data_world_size}: a short last batch would leave some ranks empty.'
            )
        self.data_rank, self.data_world_size = data_rank, data_world_size
        return self

    @property
    def min_batch_size(self) -> int:
        """Smallest global batch yielded (the last batch of an epoch is dropped below it)."""
        if self.drop_last:
            return self.batch_size
        return self._min_batch_size if self._min_batch_size is not None else self.data_world_size

    @remote_method('all', 'none')
    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its first batch (its shuffle order depends on ``seed + epoch``)."""
        if epoch < 0:
            raise InvalidInputError(f'epoch must be >= 0, got {epoch}.')
        self.epoch, self._position = epoch, 0

    # ---- iteration ---------------------------------------------------------------------------------------------
    @remote_method('first', 'first', mutates=False)
    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full + (1 if rest and rest >= self.min_batch_size else 0)

    def batch_indices(self, epoch: int | None = None) -> list[list[int]]:
        """Global row indices of every batch of `epoch` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        return batches[: len(self)]

    def __iter__(self) -> Iterator[Any]:
        batches = self.batch_indices()
        if self._position > len(batches):
            raise InvalidInputError(
                f'DataLoader position {self._position} is past the end of epoch {self.epoch} '
                f'({len(batches)} batches): the data set changed since the state was saved.'
            )
        while self._position < len(batches):
            batch = batches[self._position]
            indices = batch[slice(*shard_bounds(len(batch), self.data_rank, self.data_world_size))]
            rows = self._fetch(indices)
            self._position += 1
            yield self.collate(rows) if self.collate is not None else rows
        self.epoch, self._position = self.epoch + 1, 0

    def _fetch(self, indices: list[int]) -> list[dict[str, Any]]:
        read_many = getattr(self.dataset, 'rows', None)
        if callable(read_many):
            return read_many(indices)
        return [self.dataset[i] for i in indices]

    # ---- resume ------------------------------------------------------------------------------------------------
    @remote_method('first', 'first', mutates=False)
    def state_dict(self) -> dict[str, Any]:
        """Epoch and position, plus what must match on resume (data size, batch size, shuffle, seed)."""
        return {
            'version': STATE_VERSION,
            'epoch': self.epoch,
            'position': self._position,
            'num_rows': len(self.dataset),
            'batch_size': self.batch_size,
            'shuffle': self.shuffle,
            'seed': self.seed,
        }

    @remote_method('all', 'none')
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` was saved. Raises `InvalidInputError` when the data or batching differ."""
        expected = {
            'num_rows': len(self.dataset),
            'batch_size': self.batch_size,
            'shuffle': self.shuffle,
            'seed': self.seed,
        }
        diff = {k: (state.get(k), v) for k, v in expected.items() if state.get(k) != v}
        if diff:
            detail = ', '.join(f'{k}: saved {a!r}, now {b!r}' for k, (a, b) in diff.items())
            raise InvalidInputError(
                f'Cannot resume the DataLoader: {detail}. Resume with the same data and '
                'batching, or start fresh with set_epoch().'
            )
        self.epoch, self._position = int(state['epoch']), int(state['position'])

    def __repr__(self) -> str:
        shard = f', shard={self.data_rank}/{self.data_world_size}' if self.data_world_size > 1 else ''
        return (
            f'DataLoader(rows={len(self.dataset)}, batch_size={self.batch_size}, shuffle={self.shuffle}, '
            f'epoch={self.epoch}, position={self._position}{shard})'
        )
