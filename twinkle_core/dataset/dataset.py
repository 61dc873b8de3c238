"""`Dataset`: one or several data sets (Hugging Face `datasets` underneath) -> preprocess -> filter -> encode.

Every step is a `datasets.map`/`filter`, so results of file-backed data sets are cached by `datasets`' fingerprints
(encoded results are keyed by `Template.fingerprint()`), and a second run with the same inputs reads the cache.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterator, Sequence

from twinkle_core.dataset.meta import DatasetMeta, as_meta
from twinkle_core.dataset.mixing import Mixing, MixingStrategy, StoppingStrategy
from twinkle_core.dataset.sources import load_meta
from twinkle_core.errors import InvalidInputError
from twinkle_core.preprocessor.base import Filter
from twinkle_core.preprocessor.conversation import chat_layout
from twinkle_core.registry import resolve

logger = logging.getLogger(__name__)

MetaSpec = DatasetMeta | str | os.PathLike[str]
ENCODE_VERSION = 1  # bump when the encode map's output format changes


class Dataset:
    """Rows of one data set, or of several mixed ones (``mixing='concat'`` or ``'interleave'``).

    Steps change the data set in place and return it, so they chain::

        ds = Dataset(DatasetMeta('data.jsonl', data_slice=range(100)))
        ds.map('AlpacaProcessor').set_template('Template', model_id=path, max_length=512).encode()

    Args:
        dataset_meta: one or several `DatasetMeta` (or paths / ``ms://`` / ``hf://`` ids).
        mixing / probabilities / seed / stopping_strategy: how several data sets are combined (see `Mixing`).
        cache_dir: where `datasets` keeps downloaded/converted files (its default cache when None).
    """

    def __init__(
        self,
        dataset_meta: MetaSpec | Sequence[MetaSpec],
        *,
        mixing: MixingStrategy = 'concat',
        probabilities: Sequence[float] | None = None,
        seed: int = 0,
        stopping_strategy: StoppingStrategy = 'first_exhausted',
        cache_dir: str | None = None,
    ) -> None:
        specs = list(dataset_meta) if isinstance(dataset_meta, (list, tuple)) else [dataset_meta]
        if not specs:
            raise InvalidInputError('Dataset needs at least one DatasetMeta.')
        metas = [as_meta(s) for s in specs]
        if len(set(metas)) != len(metas):
            raise InvalidInputError(
                f'A data set is listed twice: {[m.name for m in metas]}. Give each part a '
                'different data_slice to sample it twice.'
            )
        mix = Mixing(mixing, None if probabilities is None else tuple(probabilities), seed, stopping_strategy)
        mix.check(len(metas))
        self._setup({m: load_meta(m, cache_dir) for m in metas}, mix)

    @classmethod
    def from_hf(cls, data: Any, name: str = 'in-memory') -> Dataset:
        """Wrap a `datasets.Dataset` (or a list of row dicts) already in memory; `name` appears in messages."""
        import datasets

        if isinstance(data, list):
            data = datasets.Dataset.from_list(data)
        self = cls.__new__(cls)
        self._setup({DatasetMeta(name): data}, Mixing())
        return self

    def _setup(self, parts: dict[DatasetMeta, Any], mixing: Mixing) -> None:
        self._parts, self.mixing = parts, mixing
        self._combined: Any = None
        self.template: Any = None

    # ---- pipeline steps ----------------------------------------------------------------------------------------
    def map(
        self,
        preprocessor: Any,
        init_args: dict[str, Any] | None = None,
        *,
        dataset_meta: MetaSpec | None = None,
        num_proc: int | None = None,
        load_from_cache_file: bool | None = None,
    ) -> Dataset:
        """Turn every row into a `Trajectory` dict with `preprocessor` (a name, class, instance or function).

        The row's original columns are replaced by the preprocessor's output. `dataset_meta` restricts the step
        to one of several mixed data sets. A bad row raises `InvalidInputError` naming the data set and row.
        """
        fn = resolve('preprocessor', preprocessor, **(init_args or {}))
        label = _name_of(preprocessor, fn)
        for meta in self._select(dataset_meta):
            data = self._parts[meta]
            self._parts[meta] = data.map(
                _apply_preprocessor,
                with_indices=True,
                fn_kwargs={'fn': fn, 'where': meta.name},
                remove_columns=data.column_names,
                num_proc=num_proc,
                load_from_cache_file=load_from_cache_file,
                desc=f'{label} on {meta.name}',
            )
        return self._changed()

    def filter(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        init_args: dict[str, Any] | None = None,
        *,
        dataset_meta: MetaSpec | None = None,
        num_proc: int | None = None,
    ) -> Dataset:
        """Keep rows for which `predicate(row)` (a `Filter` or any callable) is true."""
        if not callable(predicate):
            raise InvalidInputError(f'filter needs a Filter or a callable, got {predicate!r}.')
        fn = predicate if isinstance(predicate, Filter) else Filter.from_callable(predicate, **(init_args or {}))
        for meta in self._select(dataset_meta):
            self._parts[meta] = self._parts[meta].filter(
                _apply_filter, fn_kwargs={'fn': fn}, num_proc=num_proc, desc=f'{_name_of(predicate, fn)} on {meta.name}'
            )
        return self._changed()

    def set_template(self, template: Any, model_id: Any = None, **init_args: Any) -> Dataset:
        """Choose the template `encode` uses: a name (``'Template'``, ``'Qwen3Template'``, ...), class or instance.

        `model_id` (a local model dir, ``ms://``/``hf://`` ref or a tokenizer) and `init_args` (``max_length``,
        ``truncation_strategy``, ...) are passed to a name or class.
        """
        if model_id is not None:
            init_args['model_id_or_tokenizer'] = model_id
        self.template = resolve('template', template, **init_args)
        return self

    def encode(
        self,
        batched: bool = True,
        *,
        add_generation_prompt: bool = False,
        num_proc: int | None = None,
        load_from_cache_file: bool | None = None,
    ) -> Dataset:
        """Rows -> `InputFeature` dicts (``input_ids``, ``labels``, plus the trajectories' extra fields).

        ``add_generation_prompt=True`` encodes RL prompts (no labels). Cached under the template's fingerprint.
        A data set still in a plain chat layout (``conversations``, or ``query`` / ``response``) is first converted
        by `MessagesProcessor` (logged); any other needs a preprocessor `map`-ped first.
        """
        from datasets.fingerprint import Hasher

        if self.template is None:
            raise InvalidInputError(
                'Call set_template(...) before encode(), e.g. '
                "dataset.set_template('Template', model_id='path/to/model')."
            )
        template_key = self.template.fingerprint() if hasattr(self.template, 'fingerprint') else None
        for meta, data in list(self._parts.items()):
            layout = chat_layout(data.column_names)
            if layout is not None and 'messages' not in layout:
                logger.info(
                    '%s has no "messages" column: converting its %s columns with MessagesProcessor (map a '
                    'preprocessor before encode() to choose another conversion).',
                    meta.name,
                    '/'.join(layout),
                )
                self.map('MessagesProcessor', dataset_meta=meta, load_from_cache_file=load_from_cache_file)
                data = self._parts[meta]
            if 'messages' not in data.column_names:
                hint = (
                    'it is already encoded; build the Dataset again to encode with another template'
                    if 'input_ids' in data.column_names
                    else 'map it with a preprocessor first, e.g. .map("MessagesProcessor")'
                )
                raise InvalidInputError(f'{meta.name} has no "messages" column (columns: {data.column_names}): {hint}.')
            fingerprint = None
            if template_key is not None:
                fingerprint = Hasher.hash([data._fingerprint, template_key, add_generation_prompt, ENCODE_VERSION])
            self._parts[meta] = data.map(
                _encode_rows,
                batched=batched,
                with_indices=True,
                remove_columns=data.column_names,
                fn_kwargs={
                    'template': self.template,
                    'prompt_only': add_generation_prompt,
                    'where': meta.name,
                    'batched': batched,
                },
                num_proc=num_proc,
                new_fingerprint=fingerprint,
                load_from_cache_file=load_from_cache_file,
                desc=f'Encode {meta.name} with {type(self.template).__name__}',
            )
        return self._changed()

    # ---- access ------------------------------------------------------------------------------------------------
    @property
    def data(self) -> Any:
        """The combined Hugging Face `datasets.Dataset`."""
        if self._combined is None:
            self._combined = self.mixing.combine(list(self._parts.values()))
        return self._combined

    @property
    def metas(self) -> list[DatasetMeta]:
        return list(self._parts)

    def part(self, dataset_meta: MetaSpec) -> Any:
        """The Hugging Face `datasets.Dataset` of one mixed data set."""
        return self._parts[self._select(dataset_meta)[0]]

    @property
    def column_names(self) -> list[str]:
        return self.data.column_names

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not isinstance(index, int):
            raise TypeError(f'Dataset indices are ints (use .rows([...]) for several), got {type(index).__name__}.')
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f'row {index} is out of range for a data set of {n} rows.')
        return self.data[index % n]

    def rows(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Several rows at once (one Arrow read), in the order given."""
        if not indices:
            return []
        columns = self.data[list(indices)]
        names = list(columns)
        return [dict(zip(names, values)) for values in zip(*(columns[k] for k in names))]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.data)

    def __repr__(self) -> str:
        parts = ', '.join(f'{m.name}({len(d)})' for m, d in self._parts.items())
        return f'Dataset([{parts}], mixing={self.mixing.strategy!r}, template={self.template!r})'

    # ---- internals ---------------------------------------------------------------------------------------------
    def _select(self, dataset_meta: MetaSpec | None) -> list[DatasetMeta]:
        if dataset_meta is None:
            return list(self._parts)
        if isinstance(dataset_meta, DatasetMeta):
            if dataset_meta in self._parts:
                return [dataset_meta]
        else:
            wanted = os.fspath(dataset_meta)
            hits = [m for m in self._parts if m.dataset_id_or_path == wanted]
            if len(hits) == 1:
                return hits
            if len(hits) > 1:
                raise InvalidInputError(f'{wanted!r} names {len(hits)} mixed parts; pass the exact DatasetMeta.')
        known = [m.dataset_id_or_path for m in self._parts]
        raise InvalidInputError(f"{dataset_meta!r} is not one of this Dataset's data sets: {known}.")

    def _changed(self) -> Dataset:
        self._combined = None
        return self


def _name_of(spec: Any, resolved: Any) -> str:
    if isinstance(spec, str):
        return spec
    fn = getattr(resolved, 'fn', None)
    return getattr(fn, '__name__', None) or type(resolved).__name__


def _apply_preprocessor(row: dict[str, Any], index: int, *, fn: Any, where: str) -> dict[str, Any]:
    try:
        out = fn(row)
    except InvalidInputError as exc:
        raise InvalidInputError(f'{where}, row {index}: {exc}') from None
    if hasattr(out, 'model_dump'):
        out = out.model_dump(exclude_none=True)
    if not isinstance(out, dict) or 'messages' not in out:
        raise InvalidInputError(
            f'{where}, row {index}: the preprocessor returned {type(out).__name__} without '
            f"'messages'; a preprocessor must return a Trajectory dict."
        )
    return out


def _apply_filter(row: dict[str, Any], *, fn: Any) -> bool:
    return bool(fn(row))


def _encode_rows(
    batch: dict[str, Any], indices: Any, *, template: Any, prompt_only: bool, where: str, batched: bool
) -> dict[str, Any]:
    if not batched:
        batch, indices = {k: [v] for k, v in batch.items()}, [indices]
    names = list(batch)
    rows = [dict(zip(names, values)) for values in zip(*(batch[k] for k in names))]
    rows = [{k: v for k, v in r.items() if v is not None or k == 'messages'} for r in rows]
    try:
        encoded = template.encode_batch(rows, add_generation_prompt=prompt_only)
    except InvalidInputError:
        encoded = []
        for row, index in zip(rows, indices):  # find and name the offending row
            try:
                encoded.append(template.encode(row, add_generation_prompt=prompt_only))
            except InvalidInputError as exc:
                raise InvalidInputError(f'{where}, row {index}: {exc}') from None
    keys = list(dict.fromkeys(k for e in encoded for k in e))  # union: a field may be None (absent) in some rows
    out = {k: [e.get(k) for e in encoded] for k in keys}
    return out if batched else {k: v[0] for k, v in out.items()}
