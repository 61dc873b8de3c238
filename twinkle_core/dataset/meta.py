"""`DatasetMeta`: which data set, which subset and split, and which rows of it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NoReturn, Sequence

from twinkle_core.errors import InvalidInputError

DataSlice = int | range | slice | Sequence[int] | None


@dataclass(frozen=True)
class DatasetMeta:
    """A data set reference.

    Args:
        dataset_id_or_path: a local file (json/jsonl/csv/parquet/arrow), a directory (``save_to_disk`` output or a
            folder of data files), ``ms://org/name`` (ModelScope) or ``hf://org/name`` (Hugging Face). Other
            ``scheme://`` prefixes are looked up as ``dataset_source`` plugins.
        subset_name: the hub data set's configuration / subset.
        split: the split to load (``'train'``); a single local file is one split and ignores it.
        data_slice: rows to keep: ``int`` N = the first N rows (fewer if the data set is shorter), or a range,
            slice or list of row indices.
    """

    dataset_id_or_path: str
    subset_name: str | None = None
    split: str = 'train'
    data_slice: DataSlice = None

    def __post_init__(self) -> None:
        path = self.dataset_id_or_path
        if isinstance(path, os.PathLike):
            object.__setattr__(self, 'dataset_id_or_path', os.fspath(path))
        elif not isinstance(path, str) or not path:
            raise InvalidInputError(f'dataset_id_or_path must be a non-empty string or path, got {path!r}.')
        s = self.data_slice
        if isinstance(s, bool) or not (s is None or isinstance(s, (int, range, slice, list, tuple))):
            raise InvalidInputError(f'data_slice must be an int, range, slice or list of indices, got {s!r}.')
        if isinstance(s, int) and s < 0:
            raise InvalidInputError(f'data_slice={s}: the number of first rows to keep must be >= 0.')
        if isinstance(s, tuple):
            object.__setattr__(self, 'data_slice', list(s))

    @property
    def scheme(self) -> str:
        """``'ms'``, ``'hf'``, another registered ``dataset_source`` name, or ``'local'``."""
        head, sep, _ = self.dataset_id_or_path.partition('://')
        return head if sep else 'local'

    @property
    def name(self) -> str:
        """A short human name: the file or repo name, with subset and split when they are not the defaults."""
        base = self.dataset_id_or_path.rstrip('/').rsplit('/', 1)[-1]
        parts = (
            [base] + ([self.subset_name] if self.subset_name else []) + ([self.split] if self.split != 'train' else [])
        )
        return ':'.join(parts)

    def indices(self, num_rows: int) -> list[int] | None:
        """Row indices selected by `data_slice` out of `num_rows` (None = all rows)."""
        s = self.data_slice
        if s is None:
            return None
        if isinstance(s, int):
            return list(range(min(s, num_rows)))
        if isinstance(s, slice):
            return list(range(*s.indices(num_rows)))
        if isinstance(s, range):  # bounds first, from its ends: never build a list of an out-of-range range
            ends = sorted({s[0], s[-1]}) if s else []
            if ends and not (-num_rows <= ends[0] and ends[-1] < num_rows):
                self._out_of_range(f'{ends[0]}..{ends[-1]} ({s})', num_rows)
            return [i % num_rows for i in s]
        rows = list(s)
        bad = [i for i in rows if not isinstance(i, int) or not -num_rows <= i < num_rows]
        if bad:
            self._out_of_range(str(bad[:5]), num_rows)
        return [i % num_rows for i in rows]

    def _out_of_range(self, rows: str, num_rows: int) -> NoReturn:
        raise InvalidInputError(
            f'data_slice of {self.name} selects row(s) {rows} but the data set has {num_rows} '
            f'rows (valid: 0..{num_rows - 1}, or -{num_rows}..-1 from the end).'
        )

    def __hash__(self) -> int:
        s = self.data_slice
        return hash(
            (
                self.dataset_id_or_path,
                self.subset_name,
                self.split,
                tuple(s) if isinstance(s, list) else (s.start, s.stop, s.step) if isinstance(s, slice) else s,
            )
        )


def as_meta(spec: object) -> DatasetMeta:
    """`spec` (a user's value: a `DatasetMeta`, a path or a dataset id) as a `DatasetMeta`; `InvalidInputError`
    for anything else."""
    if isinstance(spec, DatasetMeta):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        return DatasetMeta(os.fspath(spec))
    raise InvalidInputError(f'Expected a DatasetMeta, a path or a dataset id, got {type(spec).__name__}: {spec!r}.')
