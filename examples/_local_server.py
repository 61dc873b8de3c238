"""Start a throw-away local server for the examples (a local model directory, by default the tiny fixture; a
temporary data dir; one tenant key)."""

from __future__ import annotations

import tempfile

from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_server import ServerConfig, start_in_thread
from twinkle_server.launch import free_port
from twinkle_server.service.auth import create_api_key


def start_local_server(alias: str = 'Qwen/Qwen3-0.6B', model_dir: str | None = None):
    """(running server, api key) serving `model_dir` (default: the tiny fixture) under `alias` on 127.0.0.1."""
    running = start_in_thread(
        ServerConfig(
            models={alias: model_dir or str(ensure_tiny_model('tiny'))},
            data_dir=tempfile.mkdtemp(prefix='twinkle-example-'),
            port=free_port(),
        )
    )
    return running, create_api_key(running.service.store, 'example')
