"""Turning a `ServerConfig` into engines: every model in this process (`embedded`) or in Ray device groups (`ray`).

`build_engines` is what the app's start-up calls; it reads only `config.model_specs` and `config.deployment`.
"""

from __future__ import annotations

from twinkle_server.config import ServerConfig
from twinkle_server.engine import Engine, load_engine

__all__ = ['build_engines']


def build_engines(config: ServerConfig, device: str | None = None) -> dict[str, Engine]:
    """Public model name -> its engine. Embedded: `load_engine` per `ModelSpec` with the spec's own backend,
    sampler, arguments and device (`device` where the spec names none: CUDA when available, else CPU).
    Ray: `twinkle_server.ray_deploy.build_ray_engines(config)` (ImportError when that package is missing)."""
    if config.deployment.mode == 'ray':
        from twinkle_server.ray_deploy import build_ray_engines

        return build_ray_engines(config)
    if config.deployment.mode != 'embedded':
        raise ValueError(f"unknown deployment mode {config.deployment.mode!r}; expected 'embedded' or 'ray'")
    return {
        name: load_engine(
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
