"""The `http` runtime: ``twinkle.initialize(mode='http', base_url=..., api_key=...)`` makes
``MultiLoraTransformersModel(..., remote_group='x')`` (or any Model / Sampler class) a proxy to the server: a
`RemoteModel` / `RemoteSampler` driving whatever backend and sampler the server hosts."""
from __future__ import annotations

from typing import Any

from twinkle_core.runtime.base import Runtime


class HttpRuntime(Runtime):
    name = 'http'

    def start(self, *, groups: Any = None, global_device_mesh: Any = None, base_url: str | None = None,
              api_key: str | None = None, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f'the http runtime takes base_url= and api_key=, got {sorted(kwargs)}')
        if base_url is None or api_key is None:
            raise TypeError("initialize(mode='http') needs base_url= and api_key=")
        from twinkle_client.client import init_twinkle_client
        self.client = init_twinkle_client(base_url, api_key)

    def build(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], *, remote_group: str | None = None,
              device_mesh: Any = None) -> Any:
        from twinkle_core.model.base import Model
        from twinkle_core.sampler.base import Sampler
        from twinkle_client import remote
        if issubclass(cls, Model):
            return remote.RemoteModel(*args, client=self.client, **kwargs)
        if issubclass(cls, Sampler):
            return remote.RemoteSampler(*args, client=self.client, **kwargs)
        raise TypeError(f'the http runtime hosts models and samplers, not {cls.__name__}')

    def shutdown(self) -> None:
        client = getattr(self, 'client', None)
        if client is not None:
            client.close()
