"""What the server tests import by name (a module, not `conftest`: under pytest-xdist a worker's `conftest` module
may be another directory's)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

#: the name the shared server (conftest.py) serves the tiny fixture under
MODEL = 'tiny-qwen3'


def openai_client(server: Any, key: str, timeout: float = 120) -> Any:
    """An `openai.OpenAI` client of the tenant of `key` on `server`'s `/v1`, without retries (a test sees every
    answer); close it (or use it as a context manager)."""
    import openai

    return openai.OpenAI(base_url=f'{server.base_url}/v1', api_key=key, max_retries=0, timeout=timeout)


@contextmanager
def backend_server(
    model_dir: Path, data_dir: Path, backend: str, tenant: str, name: str = MODEL
) -> Iterator[tuple[str, str]]:
    """A server process training `backend` on `model_dir` (served as `name`, TorchSampler): (its URL, an API key of
    `tenant`), stopped on exit."""
    from twinkle_server.launch import free_port, start_process
    from twinkle_server.service.auth import create_api_key
    from twinkle_server.store import Store

    port = free_port()
    store = Store(str(data_dir))
    key = create_api_key(store, tenant)
    store.close()
    proc = start_process(
        {name: str(model_dir)},
        str(data_dir),
        port,
        extra_args=('--backend', backend, '--backend-args', '{"max_length": 256}', '--sampler', 'TorchSampler'),
    )
    try:
        yield f'http://127.0.0.1:{port}', key
    finally:
        proc.terminate()
        proc.wait(timeout=30)
