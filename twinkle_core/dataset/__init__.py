"""Data pipeline: `DatasetMeta` -> `Dataset` (preprocess, filter, encode, mix) -> `DataLoader` (batches).

`DataLoader` is pure Python; `Dataset` imports Hugging Face `datasets` only when built.
"""

from twinkle_core.dataset.dataloader import DataLoader
from twinkle_core.dataset.dataset import Dataset
from twinkle_core.dataset.meta import DatasetMeta
from twinkle_core.dataset.mixing import Mixing

__all__ = ['DataLoader', 'Dataset', 'DatasetMeta', 'Mixing']
