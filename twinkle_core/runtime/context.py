"""The active runtime, and the metaclass that lets ``Cls(..., remote_group='model')`` build a remote proxy.

Under the `local` runtime (the default) `remote_group` is dropped and the object is built here. Under a remote
runtime (e.g. `ray`) the runtime's `build` returns a proxy whose methods follow the interface's `remote_method`
declarations. This is the one place where construction is redirected; it is explicit in `initialize(mode=...)`.
"""

from __future__ import annotations

from abc import ABCMeta
from typing import Any

from twinkle_core.mesh import DeviceGroup, DeviceMesh
from twinkle_core.registry import resolve
from twinkle_core.runtime.base import Runtime

_active: Runtime | None = None
_mesh: DeviceMesh | None = None
_groups: list[DeviceGroup] = []


def initialize(
    mode: str = 'local',
    *,
    groups: list[DeviceGroup] | None = None,
    global_device_mesh: DeviceMesh | None = None,
    notifier: Any = None,
    loggers: list[Any] | None = None,
    **kwargs: Any,
) -> Runtime:
    """Pick and start the runtime plugin named `mode` (kind `runtime`). Calling it again replaces the runtime.

    `notifier`: alert somebody when the job fails -- a webhook URL, a dict of `WebhookNotifier` arguments
    (``{'url': ..., 'format': 'dingtalk', 'secret': ...}``) or an object implementing ``twinkle_failure``
    (`twinkle_core.hooks.notifier`). None keeps the one installed before, if any.

    `loggers`: metrics loggers for the metrics this process emits, by name or ``{'name': ..., **arguments}``
    (``['jsonl', {'name': 'wandb', 'project': 'sft'}]``; `twinkle_core.hooks.select`).
    """
    global _active, _mesh, _groups
    if notifier is not None:
        from twinkle_core.hooks.notifier import install_notifier

        install_notifier(notifier)
    if loggers:
        from twinkle_core.hooks.select import install_loggers

        install_loggers(loggers)
    runtime = resolve('runtime', mode)
    if _active is not None and _active is not runtime:
        _active.shutdown()
    runtime.start(groups=groups, global_device_mesh=global_device_mesh, **kwargs)
    # The global mesh describes *this* process's ranks only in SPMD (local/torchrun); a remote runtime keeps it as
    # the default mesh of its device groups, and the driver itself is a single process.
    _mesh = global_device_mesh if runtime.name == 'local' else None
    _active, _groups = runtime, list(groups or [])
    return runtime


def current_runtime() -> Runtime | None:
    return _active


def global_device_mesh() -> DeviceMesh | None:
    """The mesh this process is one rank of (given to ``initialize`` under the local runtime), or None."""
    return _mesh


def device_groups() -> list[DeviceGroup]:
    return list(_groups)


def shutdown() -> None:
    global _active, _mesh, _groups
    if _active is not None:
        _active.shutdown()
    _active, _mesh, _groups = None, None, []


class HostedComponentMeta(ABCMeta):
    """Metaclass of components a runtime may host elsewhere (models, samplers, data loaders)."""

    def __call__(
        cls, *args: Any, remote_group: str | None = None, lazy_collect: bool | None = None, **kwargs: Any
    ) -> Any:
        """`remote_group` names the device group to host the component in (ignored by the local runtime);
        `lazy_collect=True` makes a remote proxy return fetch-on-use results (local calls return values); None: the
        runtime's default (``initialize(..., lazy_collect=...)``)."""
        runtime = _active
        if remote_group is not None and runtime is not None and runtime.name != 'local':
            device_mesh = kwargs.pop('device_mesh', None)
            options = {'lazy_collect': lazy_collect} if lazy_collect is not None else {}
            return runtime.build(cls, args, kwargs, remote_group=remote_group, device_mesh=device_mesh, **options)
        return super().__call__(*args, **kwargs)
