"""Start a throw-away local server for the examples (tiny fixture model, temporary data dir, one tenant key)."""

from __future__ import annotations

import tempfile

from twinkle_core.fixtures.tiny_model import ensure_tiny_model
from twinkle_server import ServerConfig, start_in_thread
from twinkle_server.launch import free_port
from twinkle_server.service.auth import create_api_key


def start_local_server(alias: str = 'Qwen/Qwen3-0.6B'):
    """(running server, api key) serving the tiny model under `alias` on 127.0.0.1."""
    running = start_in_thread(
        ServerConfig(
            models={alias: str(ensure_tiny_model('tiny'))},
            data_dir=tempfile.mkdtemp(prefix='twinkle-example-'),
            port=free_port(),
        )
    )
    return running, create_api_key(running.service.store, 'example')
