"""What the server tests import by name (a module, not `conftest`: under pytest-xdist a worker's `conftest` module
may be another directory's)."""

from __future__ import annotations

from typing import Any

#: the name the shared server (conftest.py) serves the tiny fixture under
MODEL = 'tiny-qwen3'


def openai_client(server: Any, key: str, timeout: float = 120) -> Any:
    """An `openai.OpenAI` client of the tenant of `key` on `server`'s `/v1`, without retries (a test sees every
    answer); close it (or use it as a context manager)."""
    import openai

    return openai.OpenAI(base_url=f'{server.base_url}/v1', api_key=key, max_retries=0, timeout=timeout)
