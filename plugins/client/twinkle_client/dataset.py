"""`Dataset` whose loading, preprocessing and encoding run on the twinkle server (the Twinkle documents'
``twinkle_client.dataset.Dataset``): the same calls as `twinkle_core.dataset.Dataset`, recorded here and run
there against a hosted model's template when a `twinkle_client.dataloader.DataLoader` first needs the rows.

    dataset = Dataset(dataset_meta=DatasetMeta('ms://swift/self-cognition', data_slice=range(500)))
    dataset.set_template('Qwen3_5Template', model_id='ms://Qwen/Qwen3.5-4B', max_length=512)
    dataset.map('SelfCognitionProcessor', init_args={'model_name': ..., 'model_author': ...})
    dataset.encode(batched=True)

Components are registered names; the data comes from ``ms://`` / ``hf://`` or a root the operator allowed.
"""

from __future__ import annotations

from typing import Any

from twinkle_client.client import TwinkleClient, default_client
from twinkle_core.errors import InvalidInputError


class Dataset:
    def __init__(self, dataset_meta: Any, *, client: TwinkleClient | None = None) -> None:
        self.meta = _meta_json(dataset_meta)
        self.steps: list[list[Any]] = []
        self.client = client
        self._rows: list[dict[str, Any]] | None = None

    def set_template(self, template: str, model_id: str | None = None, **init_args: Any) -> Dataset:
        """`model_id`: a base model the server hosts (its public name, ``ms://`` prefix allowed)."""
        self._step('set_template', _name(template, 'set_template'), {**init_args, 'model_id': model_id})
        return self

    def map(self, preprocessor: str, init_args: dict[str, Any] | None = None, **kwargs: Any) -> Dataset:
        """`kwargs` (``load_from_cache_file``, ...) are for local datasets and ignored here: the server caches."""
        self._step('map', _name(preprocessor, 'map'), {'init_args': dict(init_args or {})})
        return self

    def encode(self, batched: bool = True, *, add_generation_prompt: bool = False, **kwargs: Any) -> Dataset:
        self._step('encode', {'batched': batched, 'add_generation_prompt': add_generation_prompt})
        return self

    def built(self) -> list[dict[str, Any]]:
        """All encoded rows, built on the server on first use (after a change of steps, again)."""
        if self._rows is None:
            client = self.client or default_client()
            self._rows = client.conn.post('/twinkle/v1/datasets', {'meta': self.meta, 'steps': self.steps})['rows']
        return self._rows

    def rows(self, indices: list[int]) -> list[dict[str, Any]]:
        """Several rows at once, in the order given (what `DataLoader` reads)."""
        built = self.built()
        return [built[i] for i in indices]

    def __len__(self) -> int:
        return len(self.built())

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.built()[index]

    def _step(self, *step: Any) -> None:
        self.steps.append(list(step))
        self._rows = None


def _name(component: Any, op: str) -> str:
    if not isinstance(component, str):
        raise InvalidInputError(
            f'{op}: a server-side dataset takes registered component names (strings), got '
            f'{type(component).__name__}; objects cannot travel to the server.'
        )
    return component


def _meta_json(meta: Any) -> dict[str, Any]:
    """A `DatasetMeta` as JSON (a range slice as {start, stop, step})."""
    fields = {'dataset_id_or_path': meta.dataset_id_or_path, 'subset_name': meta.subset_name, 'split': meta.split}
    s = meta.data_slice
    if isinstance(s, range):
        fields['data_slice'] = {'start': s.start, 'stop': s.stop, 'step': s.step}
    elif s is not None:
        if isinstance(s, slice):
            raise InvalidInputError('a server-side dataset takes data_slice as an int, a range or a list of indices')
        fields['data_slice'] = s if isinstance(s, int) else list(s)
    return fields
