"""Reading W&B and SwanLab run files back with the trackers' own code (tests of the tracker loggers).

The W&B run file is decoded with W&B's own record protobuf (``wandb.proto.wandb_internal_pb2.Record``; W&B
(0.31 included) ships no Python reader, wandb-core writes the file in LevelDB's log format), the SwanLab one with
SwanLab's own ``DataStoreReader`` and record protobuf. The W&B file is read right after
``WandbMetricsLogger.close()``, which returns only once it is complete (``trackers.wandb_log_complete``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

OFFLINE_ENV = {
    'WANDB_MODE': 'offline',
    'WANDB_SILENT': 'true',
    'WANDB_CONSOLE': 'off',
    'WANDB_DISABLE_GIT': 'true',
    'WANDB_DISABLE_CODE': 'true',
    'WANDB_X_DISABLE_STATS': 'true',
    'WANDB_X_DISABLE_META': 'true',
    'WANDB_X_DISABLE_MACHINE_INFO': 'true',
    'WANDB_INIT_TIMEOUT': '60',
    'SWANLAB_MODE': 'offline',
    'SWANLAB_TERMINAL_PROXY_TYPE': 'none',
    'SWANLAB_PROBE_MONITOR': 'false',
    'SWANLAB_PROBE_GIT': 'false',
    'SWANLAB_PROBE_REQUIREMENTS': 'false',
}


def offline_trackers_env(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """W&B offline (a ``.wandb`` transaction log: no login, no upload) and SwanLab offline (a ``.swanlab`` run
    file for ``swanlab sync``), with system probes, code/git capture and terminal capture off, and every
    directory they write under `home`: neither library reaches for the network, so nothing can hang on it."""
    monkeypatch.delenv('WANDB_API_KEY', raising=False)
    monkeypatch.delenv('RANK', raising=False)
    for var, value in OFFLINE_ENV.items():
        monkeypatch.setenv(var, value)
    for var in ('WANDB_DIR', 'WANDB_CONFIG_DIR', 'WANDB_CACHE_DIR', 'WANDB_DATA_DIR', 'SWANLAB_SAVE_DIR'):
        monkeypatch.setenv(var, str(home / var.lower()))


def wandb_history(run_file: Path) -> dict[int, dict[str, float]]:
    """step -> metrics of a W&B ``.wandb`` file: LevelDB log framing, each record a W&B ``Record`` protobuf."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b':W&B', 'not a W&B transaction log'
    block, pos, pending, history = 32768, 7, b'', {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack('<IHB', data[pos : pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b''
            if record.WhichOneof('record_type') == 'history':
                items = {
                    item.key or '/'.join(item.nested_key): json.loads(item.value_json) for item in record.history.item
                }
                history[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith('_')}
    return history


def swanlab_scalars(run_file: Path) -> dict[int, dict[str, float]]:
    """step -> metrics of a SwanLab ``.swanlab`` run file, read with SwanLab's own reader."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    reader, scalars = DataStoreReader(), {}
    reader.open(run_file)
    while (data := reader.scan()) is not None:
        record = Record()
        record.ParseFromString(data)
        if record.WhichOneof('record_type') == 'scalar':
            scalars.setdefault(record.scalar.step, {})[record.scalar.key] = record.scalar.value.number
    return scalars
