"""A real server hosting the tiny Qwen3-VL fixture, shared by the image tests (test_tinker_images, test_image_limits).

Import the fixtures into a test module by name (``from vl_fixtures import client, vl_server``); `serve_vl` starts a
variant with other config fields.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import tinker

VL = 'tiny-vl'


def serve_vl(data_dir: Path, model_dir: Path, **config: Any) -> Any:
    """A started server (`start_in_thread`) hosting the VL fixture as `VL`; `config`: more `ServerConfig` fields
    (64 adapters per tenant unless `default_limits` is given)."""
    from twinkle_server import ServerConfig, TenantLimits, start_in_thread
    from twinkle_server.launch import free_port

    logging.getLogger('tinker').setLevel(logging.ERROR)
    config.setdefault('default_limits', TenantLimits().merged({'max_adapters': 64}))
    return start_in_thread(
        ServerConfig(models={VL: str(model_dir)}, data_dir=str(data_dir), port=free_port(), **config)
    )


@pytest.fixture(scope='module')
def vl_server(tmp_path_factory, tiny_vl_model_dir):
    """(running server with default limits, API key of tenant carol)."""
    from twinkle_server.service.auth import create_api_key

    running = serve_vl(tmp_path_factory.mktemp('vl-data'), tiny_vl_model_dir)
    yield running, create_api_key(running.service.store, 'carol')
    running.stop()


@pytest.fixture(scope='module')
def client(vl_server) -> tinker.ServiceClient:
    running, key = vl_server
    return tinker.ServiceClient(base_url=running.base_url, api_key=key)
