"""`http_server` runtime: the server side of ``initialize(mode='http', groups=...)``.

A script that calls ``twinkle_core.initialize(mode='http', groups=device_groups)`` without ``base_url`` (the
Twinkle documents' ``server.py``) starts a training server here and serves until it is stopped (SIGTERM/SIGINT
drain it). What it serves comes from a config file (``config=`` or the ``TWINKLE_SERVER_CONFIG`` environment
variable; docs/deployment.md); the device groups place every model of it on Ray:

- the group named ``model`` is each model's training group (its ``ranks``, ``device_type`` and options);
- the group named ``sampler`` gives each model ``ranks`` sampler replicas of one process each.

Without groups the file's own deployment is used as is.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.runtime.base import Runtime
from twinkle_server.config import DeploymentConfig, GroupSpec, load_server_config

CONFIG_ENV = 'TWINKLE_SERVER_CONFIG'
GROUP_ROLES = ('model', 'sampler')


class ServerRuntime(Runtime):
    name = 'http_server'

    def start(
        self,
        *,
        groups: list[Any] | None = None,
        global_device_mesh: Any = None,
        config: str | None = None,
        log_format: str | None = None,
        **overrides: Any,
    ) -> None:
        """Serve the models of `config` (default ``$TWINKLE_SERVER_CONFIG``) placed by `groups`; blocks until the
        server stops. `overrides`: top-level sections laid over the file (e.g. ``server={'port': 9000}``);
        `log_format` (given): the file's `server.log_format`."""
        from twinkle_server.launch import serve

        path = config or os.environ.get(CONFIG_ENV)
        if not path:
            raise InvalidInputError(
                f"initialize(mode='http') without base_url= starts a server: give it the config "
                f'file of what to serve (config=... or ${CONFIG_ENV}; docs/deployment.md), or '
                'pass base_url= and api_key= to connect to one.'
            )
        if log_format is not None:
            overrides['server'] = {**overrides.get('server', {}), 'log_format': log_format}
        served = placed_by_groups(load_server_config(path, overrides or None), groups or [])
        serve(served)

    def build(
        self,
        cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        remote_group: str | None = None,
        device_mesh: Any = None,
    ) -> Any:
        raise TypeError(
            'this process runs the training server; components are built by its clients '
            "(initialize(mode='http', base_url=..., api_key=...))"
        )


def placed_by_groups(config: Any, groups: list[Any]) -> Any:
    """`config` with every model placed by `groups` (module docstring); unchanged without groups."""
    if not groups:
        return config
    by_role = {g.name: g for g in groups}
    unknown = sorted(set(by_role) - set(GROUP_ROLES))
    if unknown:
        raise InvalidInputError(
            f'device groups {unknown} have no role in a server; name them {GROUP_ROLES} '
            '(training group, sampler replicas).'
        )

    def group_spec(group: Any, ranks: int) -> GroupSpec:
        opts = group.options
        return GroupSpec(
            ranks=ranks,
            device_type=group.device_type,
            num_cpus=opts.get('num_cpus'),
            num_gpus=opts.get('num_gpus'),
            resources=opts.get('resources'),
        )

    from twinkle_server.engine.model_host.construction import takes_device_mesh

    specs = {}
    for name, spec in config.model_specs.items():
        if 'model' in by_role and by_role['model'].world_size > 1 and not takes_device_mesh(spec.backend):
            raise InvalidInputError(
                f"device group 'model' has {by_role['model'].world_size} ranks but {name!r} is "
                f'trained by {spec.backend}, which trains on one rank: give the group ranks=1, '
                'or the model a backend that takes a device_mesh (e.g. TransformersModel).'
            )
        changes: dict[str, Any] = {'device': None}
        if 'model' in by_role:
            changes.update(train_group=group_spec(by_role['model'], by_role['model'].world_size), mesh=None)
        if 'sampler' in by_role:
            changes.update(
                sampler_group=group_spec(by_role['sampler'], 1), sampler_replicas=by_role['sampler'].world_size
            )
        specs[name] = dataclasses.replace(spec, **changes)
    deployment = config.deployment if config.deployment.mode == 'ray' else DeploymentConfig(mode='ray')
    return dataclasses.replace(config, models={}, model_specs=specs, deployment=deployment)
