"""The `local` runtime: components are plain objects in this process (single process, or SPMD under torchrun).

Under torchrun every rank runs the same script; ``initialize(mode='local', global_device_mesh=mesh)`` brings up
the default process group from torchrun's environment (gloo on CPU, nccl on CUDA) and components built without
an explicit `device_mesh` use the global one (`twinkle_core.runtime.context.global_device_mesh()`).

Teardown: `shutdown` (``twinkle_core.shutdown()``, called by every rank at the end of the script) destroys the group
this runtime created after a barrier (`distributed.destroy_process_group` explains why that barrier also keeps gloo
from aborting the process at exit). A script that never gets there (an exception, a forgotten shutdown) has the group
destroyed by an exit hook, without the barrier: the other ranks may be stuck in a collective and would never join it.
"""

from __future__ import annotations

import atexit
from typing import Any

from twinkle_core.runtime import distributed
from twinkle_core.runtime.base import Runtime


class LocalRuntime(Runtime):
    name = 'local'

    def __init__(self) -> None:
        self._owns_process_group = False

    def start(
        self,
        *,
        groups: list[Any] | None = None,
        global_device_mesh: Any = None,
        backend: str | None = None,
        **kwargs: Any,
    ) -> None:
        """`backend` overrides the process-group backend (default: gloo on CPU, nccl on CUDA)."""
        if kwargs:
            raise TypeError(f'the local runtime takes no options besides `backend`, got {sorted(kwargs)}')
        if groups:
            raise TypeError(
                'device groups place components on Ray actors; the local runtime runs everything in '
                "this process. Use initialize(mode='ray', groups=...) or drop `groups`."
            )
        existed = distributed.is_initialized()
        created = distributed.init_process_group(global_device_mesh, backend=backend) and not existed
        if created and not self._owns_process_group:
            atexit.register(self._destroy_at_exit)
        self._owns_process_group = self._owns_process_group or created

    def build(
        self,
        cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        remote_group: str | None = None,
        device_mesh: Any = None,
    ) -> Any:
        if device_mesh is not None:
            kwargs = {**kwargs, 'device_mesh': device_mesh}
        return cls(*args, **kwargs)

    def shutdown(self) -> None:
        """Destroy the process group if `start` created it. Collective: every rank calls it after its last
        collective (a barrier runs first)."""
        if self._owns_process_group:
            self._owns_process_group = False
            atexit.unregister(self._destroy_at_exit)
            distributed.destroy_process_group(synchronize=True)

    def _destroy_at_exit(self) -> None:
        if self._owns_process_group:
            self._owns_process_group = False
            distributed.destroy_process_group(synchronize=False)
