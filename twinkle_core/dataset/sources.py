"""Built-in ``dataset_source`` plugins: how a `DatasetMeta` becomes a Hugging Face `datasets.Dataset`.

A source is any callable ``source(meta, cache_dir=None) -> datasets.Dataset`` registered in the entry-point group
``twinkle.dataset_source`` under its scheme name: ``local`` (files and directories), ``ms`` (ModelScope via
``MsDataset``), ``hf`` (Hugging Face via ``datasets.load_dataset``). `load_meta` picks one by ``meta.scheme``
and then applies ``meta.data_slice``. A hub id is only ever fetched through the hub clients (`hub_repo`): never
one that would resolve to a local path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from twinkle_core.dataset.meta import DatasetMeta
from twinkle_core.errors import HubError, InvalidInputError
from twinkle_core.hub.ref import HubRef
from twinkle_core.registry import resolve_class

# File suffix -> `datasets` builder name.
FILE_BUILDERS: dict[str, str] = {
    '.json': 'json',
    '.jsonl': 'json',
    '.csv': 'csv',
    '.tsv': 'csv',
    '.parquet': 'parquet',
    '.arrow': 'arrow',
    '.txt': 'text',
}


def load_meta(meta: DatasetMeta, cache_dir: str | None = None) -> Any:
    """Load `meta` with the source its scheme names, then select ``meta.data_slice``."""
    source = resolve_class('dataset_source', meta.scheme)
    data = source(meta, cache_dir=cache_dir)
    indices = meta.indices(len(data))
    return data if indices is None else data.select(indices)


def _only_split(data: Any, meta: DatasetMeta) -> Any:
    """A `DatasetDict` -> its `meta.split`; a `Dataset` as is."""
    import datasets

    if isinstance(data, datasets.DatasetDict):
        if meta.split not in data:
            raise InvalidInputError(f'{meta.dataset_id_or_path} has no split {meta.split!r}; splits: {sorted(data)}.')
        return data[meta.split]
    return data


def local_source(meta: DatasetMeta, cache_dir: str | None = None) -> Any:
    """A local file (by suffix), a ``save_to_disk`` directory, or a directory of data files."""
    import datasets

    path = Path(meta.dataset_id_or_path).expanduser()
    if not path.exists():
        raise InvalidInputError(
            f'Dataset {meta.dataset_id_or_path!r} is not a local file or directory. For hub '
            'data sets use "ms://org/name" (ModelScope) or "hf://org/name" (Hugging Face).'
        )
    if path.is_dir():
        if (path / 'dataset_info.json').exists() or (path / 'dataset_dict.json').exists():
            return _only_split(datasets.load_from_disk(str(path)), meta)
        return _only_split(datasets.load_dataset(str(path), meta.subset_name, cache_dir=cache_dir), meta)
    builder = FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise InvalidInputError(
            f'Cannot read {path.name}: unknown file type {path.suffix!r}; supported: {sorted(FILE_BUILDERS)}.'
        )
    kwargs = {'delimiter': '\t'} if path.suffix.lower() == '.tsv' else {}
    return datasets.load_dataset(builder, data_files=str(path), split='train', cache_dir=cache_dir, **kwargs)


def hf_source(meta: DatasetMeta, cache_dir: str | None = None) -> Any:
    """``hf://org/name[@revision]`` via `datasets.load_dataset` (honours ``HF_DATASETS_OFFLINE`` and its cache)."""
    import datasets

    repo, revision = hub_repo(meta.dataset_id_or_path)
    return datasets.load_dataset(repo, meta.subset_name, split=meta.split, revision=revision, cache_dir=cache_dir)


def ms_source(meta: DatasetMeta, cache_dir: str | None = None) -> Any:
    """``ms://org/name[@revision]`` via ModelScope's `MsDataset`, converted to a Hugging Face `Dataset`."""
    repo, revision = hub_repo(meta.dataset_id_or_path)
    try:
        from modelscope.msdatasets import MsDataset
    except ImportError as exc:
        raise InvalidInputError(
            f"Loading {meta.dataset_id_or_path} needs ModelScope's dataset extras ({exc}). "
            'Run: pip install "modelscope[datasets]" (or pip install addict).'
        ) from exc
    loaded = MsDataset.load(
        repo,
        subset_name=meta.subset_name,
        split=meta.split,
        version=revision,
        cache_dir=cache_dir or os.environ.get('MODELSCOPE_CACHE') or None,
    )
    data = loaded.to_hf_dataset() if hasattr(loaded, 'to_hf_dataset') else loaded
    return _only_split(data, meta)


def hub_repo(dataset_id: str) -> tuple[str, str | None]:
    """``'hf://org/name@rev'`` -> ``('org/name', 'rev')``: a hub id, never a local path.

    Refuses an id that is not of the ``org/name`` form (``.`` / ``..`` segments included) and one that exists
    relative to the working directory: the hub clients would read that path instead of the hub.
    """
    scheme = dataset_id.partition('://')[0]
    try:
        ref = HubRef.parse(dataset_id)
    except HubError:
        ref = None
    if ref is None or ref.name:
        raise InvalidInputError(
            f'{dataset_id!r}: expected "{scheme}://org/name[@revision]" (org and name: letters, '
            f'digits, ".", "_", "-", starting with a letter or digit).'
        )
    if os.path.lexists(ref.repo_id):
        raise InvalidInputError(
            f'{dataset_id!r}: {ref.repo_id!r} exists on this server (relative to the working '
            f'directory), and a hub id is never read from disk; name a local data set by its '
            f'path, without {scheme}://.'
        )
    return ref.repo_id, ref.revision
