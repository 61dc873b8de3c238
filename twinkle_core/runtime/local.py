"""The `local` runtime: components are plain objects in this process (single process, or SPMD under torchrun)."""
from __future__ import annotations

from typing import Any

from twinkle_core.runtime.base import Runtime


class LocalRuntime(Runtime):
    name = 'local'

    def start(self, *, groups: list[Any] | None = None, global_device_mesh: Any = None, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f'the local runtime takes no options, got {sorted(kwargs)}')

    def build(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], *, remote_group: str | None = None,
              device_mesh: Any = None) -> Any:
        if device_mesh is not None:
            kwargs = {**kwargs, 'device_mesh': device_mesh}
        return cls(*args, **kwargs)
