"""One Ray instance for the whole test session (Ray start-up costs seconds; the machine has few cores)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope='session')
def ray_cluster():
    """A local Ray instance with 4 logical CPUs; workers can import this folder's helper modules."""
    ray = pytest.importorskip('ray')
    if not ray.is_initialized():
        pythonpath = os.pathsep.join(p for p in (str(HERE), os.environ.get('PYTHONPATH', '')) if p)
        ray.init(
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={'env_vars': {'PYTHONPATH': pythonpath}},
        )
    yield ray
    ray.shutdown()
