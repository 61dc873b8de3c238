"""A real twinkle server (uvicorn on 127.0.0.1, tiny Qwen3 fixture, real engine) shared by the server tests."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pytest
from server_names import MODEL, openai_client


@dataclass
class Server:
    base_url: str
    data_dir: Path
    model_dir: Path
    running: object

    @property
    def service(self):
        return self.running.service

    def key(self, tenant: str) -> str:
        from twinkle_server.service.auth import create_api_key

        return create_api_key(self.service.store, tenant)


@pytest.fixture(scope='session')
def server(tmp_path_factory, tiny_model_dir) -> Server:
    from twinkle_server import ServerConfig, TenantLimits, start_in_thread
    from twinkle_server.launch import free_port

    logging.getLogger('tinker').setLevel(logging.ERROR)
    data_dir = tmp_path_factory.mktemp('server-data')
    # one server hosts every test's models for the whole session (none are unloaded): lift the adapter and
    # session caps; every other limit keeps its default (tests/server/test_hostile.py relies on them)
    limits = TenantLimits().merged({'max_adapters': 512, 'max_sessions': 512})
    config = ServerConfig(
        models={MODEL: str(tiny_model_dir)},
        data_dir=str(data_dir),
        port=free_port(),
        max_body_bytes=2 * 1024 * 1024,
        default_limits=limits,
    )
    running = start_in_thread(config)
    yield Server(running.base_url, data_dir, tiny_model_dir, running)
    running.stop()


@pytest.fixture(scope='session')
def alice(server) -> str:
    return server.key('alice')


@pytest.fixture(scope='session')
def bob(server) -> str:
    return server.key('bob')


@pytest.fixture(scope='module')
def client(server, alice):
    """Alice's `openai` client on `/v1`."""
    with openai_client(server, alice) as c:
        yield c


@pytest.fixture(scope='module')
def bob_client(server, bob):
    """Bob's `openai` client on `/v1`."""
    with openai_client(server, bob) as c:
        yield c


@pytest.fixture(scope='session')
def service_client(server, alice):
    import tinker

    return tinker.ServiceClient(base_url=server.base_url, api_key=alice)


@pytest.fixture(scope='session')
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope='session')
def sft_data(tokenizer):
    """Four fixed chat-like examples as Tinker Datums (weight 1 on the answer tokens only)."""
    from tinker import types

    pairs = [
        ('Who are you?', 'I am twinkle, a small model.'),
        ('What is 2+3?', 'The answer is 5.'),
        ('Name a color.', 'Blue is a color.'),
        ('Say hello.', 'Hello there, friend.'),
    ]
    out = []
    for q, a in pairs:
        prompt = tokenizer.encode(f'User: {q}\nAssistant:')
        answer = tokenizer.encode(f' {a}')
        tokens = prompt + answer
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={'target_tokens': tokens[1:], 'weights': weights},
            )
        )
    return out


@pytest.fixture(scope='session')
def postgres():
    """A throw-away PostgreSQL server for the session (`postgres_server.py`); skips where none can run."""
    from postgres_server import PostgresServer, why_unavailable

    from twinkle_server.launch import free_port

    reason = why_unavailable()
    if reason:
        pytest.skip(reason)
    pg = PostgresServer(free_port())
    yield pg
    pg.stop()


@pytest.fixture
def postgres_url(postgres) -> str:
    """The URL of a new, empty database on the session's PostgreSQL server."""
    return postgres.create_database()


from openai_tools import tool_adapter  # noqa: E402, F401 - the session-wide tool-calling adapter
