"""`init_twinkle_client`: the connection used by remote models and samplers, plus run/checkpoint listings."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from twinkle_client.http import Connection
from twinkle_core.errors import TwinkleError

_default: TwinkleClient | None = None


class Record(BaseModel):
    """A listed item: the server's fields as attributes (``run.training_run_id``), ``model_dump_json()``, and
    dict-style access (``run['training_run_id']``)."""

    model_config = ConfigDict(extra='allow', frozen=True)

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None


class TrainingRun(Record):
    training_run_id: str


class Checkpoint(Record):
    tinker_path: str

    @property
    def twinkle_path(self) -> str:
        """The path `model.load(...)` takes (``twinkle://run/weights/name``)."""
        return 'twinkle://' + self.tinker_path.split('://', 1)[1]


class TwinkleClient:
    def __init__(self, base_url: str, api_key: str) -> None:
        self.conn = Connection(base_url, api_key)

    def list_training_runs(self, limit: int = 100, offset: int = 0) -> list[TrainingRun]:
        """This tenant's training runs (newest first)."""
        runs = self.conn.get('/api/v1/training_runs', limit=limit, offset=offset)['training_runs']
        return [TrainingRun.model_validate(r) for r in runs]

    def list_checkpoints(self, run_id: str | None = None) -> list[Checkpoint]:
        """Checkpoints of one run, or all of this tenant's; each has `twinkle_path` (and `tinker_path`)."""
        if run_id is None:
            found = self.conn.get('/api/v1/checkpoints')['checkpoints']
        else:
            found = self.conn.get(f'/api/v1/training_runs/{run_id}/checkpoints')['checkpoints']
        return [Checkpoint.model_validate(c) for c in found]

    def delete_checkpoint(self, path: str) -> None:
        """Delete `twinkle://run/weights/name` (or a tinker:// path)."""
        run_id, rest = path.split('://', 1)[1].split('/', 1)
        self.conn.delete(f'/api/v1/training_runs/{run_id}/checkpoints/{rest}')

    def close(self) -> None:
        self.conn.close()


def init_twinkle_client(base_url: str, api_key: str) -> TwinkleClient:
    """Connect to a twinkle server; remote models/samplers built afterwards use this client by default."""
    global _default
    _default = TwinkleClient(base_url, api_key)
    return _default


def default_client() -> TwinkleClient:
    if _default is None:
        raise TwinkleError('no twinkle client: call init_twinkle_client(base_url=..., api_key=...) first')
    return _default
