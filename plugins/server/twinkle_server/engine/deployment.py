"""Turning a `ServerConfig` into model hosts: every model in this process (`embedded`) or in Ray device groups
(`ray`).

`build_model_hosts` is what the app's start-up calls; it reads only `config.model_specs` and `config.deployment`.
"""

from __future__ import annotations

from twinkle_server.config import ServerConfig
from twinkle_server.engine.model_host import ModelHost, load_model_host
from twinkle_server.engine.model_host.construction import backend_args_problem, model_capabilities

__all__ = ['build_engines', 'build_model_hosts', 'check_backend_args']


def build_model_hosts(config: ServerConfig, device: str | None = None) -> dict[str, ModelHost]:
    """Public model name -> its host. Embedded: `load_model_host` per `ModelSpec` with the spec's own backend,
    sampler, arguments and device (`device` where the spec names none: CUDA when available, else CPU).
    Ray: `twinkle_server.engine.ray_deploy.build_ray_model_hosts(config)` (ImportError when that package is missing).
    First, in either mode, every model's `backend_args` are checked against what its backend declares
    (`construction.backend_args_problem`): a ValueError naming the model before anything is built."""
    check_backend_args(config)
    if config.deployment.mode == 'ray':
        from twinkle_server.engine.ray_deploy import build_ray_model_hosts

        return build_ray_model_hosts(config)
    if config.deployment.mode != 'embedded':
        raise ValueError(f"unknown deployment mode {config.deployment.mode!r}; expected 'embedded' or 'ray'")
    return {
        name: load_model_host(
            name,
            spec.path,
            device=spec.device or device,
            backend=spec.backend,
            backend_args=spec.backend_args,
            sampler=spec.sampler,
            sampler_args=spec.sampler_args,
        )
        for name, spec in config.model_specs.items()
    }


def check_backend_args(config: ServerConfig) -> None:
    """Raise ValueError for the first model whose `backend_args` its backend does not declare it takes."""
    for name, spec in config.model_specs.items():
        problem = backend_args_problem(spec.backend, model_capabilities(spec.backend), spec.backend_args)
        if problem is not None:
            raise ValueError(f'model {name!r}: backend_args: {problem[0]} (expected {problem[1]})')


#: the name docs/deployment.md published before the hosts were named for what they are
build_engines = build_model_hosts
