"""The `local` runtime: components are plain objects in this process (single process, or SPMD under torchrun).

Under torchrun every rank runs the same script; ``initialize(mode='local', global_device_mesh=mesh)`` brings up
the default process group from torchrun's environment (gloo on CPU, nccl on CUDA) and components built without
an explicit `device_mesh` use the global one (`twinkle_core.runtime.context.global_device_mesh()`).
"""
from __future__ import annotations

from typing import Any

from twinkle_core.runtime import distributed
from twinkle_core.runtime.base import Runtime


class LocalRuntime(Runtime):
    name = 'local'

    def __init__(self) -> None:
        self._owns_process_group = False

    def start(self, *, groups: list[Any] | None = None, global_device_mesh: Any = None, backend: str | None = None,
              **kwargs: Any) -> None:
        """`backend` overrides the process-group backend (default: gloo on CPU, nccl on CUDA)."""
        if kwargs:
            raise TypeError(f'the local runtime takes no options besides `backend`, got {sorted(kwargs)}')
        if groups:
            raise TypeError('device groups place components on Ray actors; the local runtime runs everything in '
                            "this process. Use initialize(mode='ray', groups=...) or drop `groups`.")
        existed = distributed.is_initialized()
        created = distributed.init_process_group(global_device_mesh, backend=backend) and not existed
        self._owns_process_group = self._owns_process_group or created

    def build(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], *, remote_group: str | None = None,
              device_mesh: Any = None) -> Any:
        if device_mesh is not None:
            kwargs = {**kwargs, 'device_mesh': device_mesh}
        return cls(*args, **kwargs)

    def shutdown(self) -> None:
        """Destroy the process group if `start` created it (a torchrun script may also leave it to exit)."""
        if self._owns_process_group:
            distributed.destroy_process_group()
            self._owns_process_group = False
