"""The `http` runtime: ``twinkle.initialize(mode='http', base_url=..., api_key=...)`` makes
``MultiLoraTransformersModel(..., remote_group='x')`` (or any Model / Sampler class) a proxy to the server: a
`RemoteModel` / `RemoteSampler` driving whatever backend and sampler the server hosts.

Without ``base_url`` (a server script: ``initialize(mode='http', groups=...)``) it starts the server instead,
through the runtime registered as ``http_server`` (twinkle-server), and serves until the server stops."""

from __future__ import annotations

from typing import Any

from twinkle_client import remote
from twinkle_client.client import init_twinkle_client
from twinkle_core.model.base import Model
from twinkle_core.registry import resolve
from twinkle_core.runtime.base import Runtime
from twinkle_core.sampler.base import Sampler

SERVER_RUNTIME = 'http_server'


class HttpRuntime(Runtime):
    name = 'http'

    def start(
        self,
        *,
        groups: Any = None,
        global_device_mesh: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        if base_url is None and api_key is None:  # the server side: start one (by registry name: twinkle-server)
            resolve('runtime', SERVER_RUNTIME).start(groups=groups, global_device_mesh=global_device_mesh, **kwargs)
            return
        if kwargs:
            raise TypeError(f'the http runtime takes base_url= and api_key=, got {sorted(kwargs)}')
        if base_url is None or api_key is None:
            raise TypeError("initialize(mode='http') needs base_url= and api_key= (or neither, to start a server)")
        self.client = init_twinkle_client(base_url, api_key)

    def build(
        self,
        cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        remote_group: str | None = None,
        device_mesh: Any = None,
    ) -> Any:
        if issubclass(cls, Model):
            return remote.RemoteModel(*args, client=self.client, **kwargs)
        if issubclass(cls, Sampler):
            return remote.RemoteSampler(*args, client=self.client, **kwargs)
        raise TypeError(f'the http runtime hosts models and samplers, not {cls.__name__}')

    def shutdown(self) -> None:
        client = getattr(self, 'client', None)
        if client is not None:
            client.close()
