"""`MultiLoraTransformersModel` and `TorchSampler` that live on a twinkle server.

Same method names and arguments as the local classes (their methods are generated from the `Model` /
`Sampler` interface declarations); what differs is only where the work runs and how checkpoints are named:
`save(...)` returns a `twinkle://run/weights/name` path and `load(path, load_optimizer=True)` resumes from one
in any process, under any adapter name.

    init_twinkle_client(base_url='http://127.0.0.1:8000', api_key='tml-...')
    model = MultiLoraTransformersModel(model_id='Qwen/Qwen3-0.6B')
    model.add_adapter_to_model('mine', {'r': 8})
    model.set_optimizer('AdamW', lr=1e-4, adapter_name='mine')
    model.forward_backward(inputs=rows, adapter_name='mine'); model.clip_grad_and_step(adapter_name='mine')
    path = model.save('step-10', save_optimizer=True, adapter_name='mine')
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from twinkle_client.client import TwinkleClient, default_client
from twinkle_client.proxy import build_methods, plain, remote_call
from twinkle_core.errors import InvalidInputError
from twinkle_core.model.base import Model
from twinkle_core.sampler.base import Sampler
from twinkle_core.types import SampleResponse


class _RemoteModel:
    """Adapters of one base model on the server; each adapter is a server-side training model."""

    def __init__(self, model_id: str, *, client: TwinkleClient | None = None, **_local_only: Any) -> None:
        self.model_id = str(model_id)
        self.client = client or default_client()
        self._adapters: dict[str, str] = {}  # adapter name -> server model id
        self._current: list[str] = []

    def add_adapter_to_model(
        self, adapter_name: str, config: Any, *, gradient_accumulation_steps: int = 1, **kwargs: Any
    ) -> None:
        """Create adapter `adapter_name` on the server (`config`: a peft `LoraConfig` or dict of its fields;
        `kwargs` override its fields)."""
        if adapter_name in self._adapters:
            raise InvalidInputError(f'adapter {adapter_name!r} already exists')
        fields = {**(plain(config) or {}), **plain(kwargs)}
        out = self.client.conn.post(
            '/twinkle/v1/models',
            {
                'base_model': self.model_id,
                'config': fields,
                'seed': fields.pop('seed', None),
                'gradient_accumulation_steps': gradient_accumulation_steps,
            },
        )
        self._adapters[adapter_name] = out['model_id']

    def load(self, path: str, *, load_optimizer: bool = False, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Load a `twinkle://` checkpoint; an adapter name not created yet is created from the checkpoint."""
        name = self._name(adapter_name, must_exist=False)
        if name not in self._adapters:
            out = self.client.conn.post('/twinkle/v1/models/load', {'path': path, 'load_optimizer': load_optimizer})
            self._adapters[name] = out['model_id']
            return
        remote_call(
            self.client.conn, 'models', self._adapters[name], 'load', (path,), {'load_optimizer': load_optimizer}
        )

    def list_adapters(self) -> list[str]:
        return list(self._adapters)

    def server_model_id(self, adapter_name: str | None = None) -> str:
        """The server's id (= training run id) of an adapter."""
        return self._adapters[self._name(adapter_name)]

    @contextlib.contextmanager
    def adapter(self, adapter_name: str) -> Iterator[_RemoteModel]:
        self._name(adapter_name)
        self._current.append(adapter_name)
        try:
            yield self
        finally:
            self._current.pop()

    def _name(self, adapter_name: str | None, must_exist: bool = True) -> str:
        name = adapter_name or (self._current[-1] if self._current else None)
        if name is None and len(self._adapters) == 1:
            name = next(iter(self._adapters))
        if name is None:
            raise InvalidInputError(f'adapter_name is required; adapters: {self.list_adapters() or "none yet"}')
        if must_exist and name not in self._adapters:
            raise InvalidInputError(
                f'no adapter named {name!r}; adapters: {self.list_adapters() or "none"} '
                f'(add_adapter_to_model or load a checkpoint first)'
            )
        return name

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        name = self._name(kwargs.pop('adapter_name', None))
        if isinstance(kwargs.get('inputs'), dict) and 'input_ids' not in kwargs['inputs']:
            raise InvalidInputError("a remote model takes one adapter's rows per call; the server mixes tenants")
        return remote_call(self.client.conn, 'models', self._adapters[name], method, args, kwargs)


class _RemoteSampler:
    """A sampler of one base model on the server. Sample from a checkpoint by passing its `twinkle://` path as
    `adapter_name` (None: the base model)."""

    def __init__(self, model_id: str, *, client: TwinkleClient | None = None, **_local_only: Any) -> None:
        self.model_id = str(model_id)
        self.client = client or default_client()
        self.sampler_id = self.client.conn.post('/twinkle/v1/samplers', {'base_model': self.model_id})['sampler_id']

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = remote_call(self.client.conn, 'samplers', self.sampler_id, method, args, kwargs)
        if method == 'sample':
            return [SampleResponse.model_validate(r) for r in result]
        return result


def _forward(self: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return self._call(method, args, kwargs)


RemoteModel = type(
    'RemoteModel',
    (_RemoteModel,),
    {
        **build_methods(
            Model, _forward, skip=frozenset({'add_adapter_to_model', 'load', 'list_adapters', 'remove_adapter'})
        ),
        '__doc__': 'A model hosted by the server (whatever its backend), with the methods of the Model interface.',
        '__module__': __name__,
    },
)

RemoteSampler = type(
    'RemoteSampler',
    (_RemoteSampler,),
    {
        **build_methods(Sampler, _forward),
        '__doc__': 'The sampler hosted by the server (whatever it is), with the methods of the Sampler interface.',
        '__module__': __name__,
    },
)

# Twinkle's names for the same proxies (its documents build these classes under the http runtime).
MultiLoraTransformersModel = RemoteModel
TorchSampler = RemoteSampler
vLLMSampler = RemoteSampler  # the server's sampler, whichever it runs (the Twinkle documents' name)
