"""The service on Ray (``deployment: {mode: ray}``): the HTTP front runs in this process; every base model gets a
training device group and sampler replicas as Ray actors (`RayModelHost`), on one node or across a cluster.

Why a plain front process and not Ray Serve: the service's state that must be consistent per training model
(seq_id ordering, the per-model work queue that batches tenants into one pass, futures and their store) lives in
one place, the front, and the actors only compute. Ray Serve's replicated, autoscaled deployments would spread
that state over replicas that do not share it. Several fronts can still run against one PostgreSQL store.

Needs ``pip install twinkle-ray`` (Ray).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from twinkle_server.engine.model_host import resolve_model_dir
from twinkle_server.engine.model_host.base import ModelHost
from twinkle_server.engine.ray_deploy.model_host import RayModelHost

__all__ = ['RayModelHost', 'build_ray_model_hosts', 'connect', 'forwarded_env']

logger = logging.getLogger(__name__)


def connect(address: str | None = None, namespace: str | None = None, num_cpus: int | None = None) -> None:
    """Join the Ray cluster at `address` ('auto', 'ray://host:10001', 'host:6379'; None: ``RAY_ADDRESS``), or start
    a local one with `num_cpus` logical CPUs (`twinkle_ray.runtime.ray_address`); a Ray already initialised in this
    process is used as is."""
    import ray

    from twinkle_ray.runtime import ray_address

    if ray.is_initialized():
        return
    address = ray_address(address)
    ray.init(
        address=address,
        namespace=namespace or 'twinkle-server',
        num_cpus=num_cpus if address == 'local' else None,
        include_dashboard=False,
        log_to_driver=True,
    )


def forwarded_env() -> dict[str, str]:
    """Environment the actors inherit from the front (hub offline switches, thread counts, twinkle settings)."""
    from twinkle_ray.runtime import FORWARDED_ENV_PREFIXES

    return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}


def build_ray_model_hosts(config: Any) -> dict[str, ModelHost]:
    """A `RayModelHost` per configured model, after connecting to Ray as ``config.deployment.ray`` says."""
    ray_config = config.deployment.ray
    connect(ray_config.address, ray_config.namespace, ray_config.num_cpus)
    env = forwarded_env()
    hosts: dict[str, ModelHost] = {}
    try:
        for name, spec in config.model_specs.items():
            hosts[name] = RayModelHost(spec, resolve_model_dir(spec.path), env)
            logger.info(
                '%s: training on %d Ray worker(s), %d sampler replica(s)',
                name,
                spec.train_group.ranks,
                spec.sampler_replicas,
            )
    except BaseException:
        for host in hosts.values():
            host.close()
        raise
    return hosts
