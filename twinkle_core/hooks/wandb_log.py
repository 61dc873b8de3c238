"""Whether a W&B run's transaction log is complete on disk, and waiting for it (`WandbMetricsLogger.close`)."""

from __future__ import annotations

import logging
import os
import struct
import time
from typing import Any

logger = logging.getLogger(__name__)

WANDB_LOG_TIMEOUT_S = 60.0  # how long `WandbMetricsLogger.close` waits for a finished run's log to be on disk

_LOG_BLOCK, _LOG_HEADER = 32768, 7  # LevelDB log: 32 KiB blocks; a chunk header; W&B's file header (same size)
_FULL, _FIRST, _LAST = 1, 2, 4  # chunk kinds (MIDDLE is 3)


def wandb_log_complete(path: str | os.PathLike[str]) -> bool:
    """Whether the W&B transaction log at `path` (``run-<id>.wandb``) holds its run's exit record.

    wandb-core writes that file in LevelDB's log format (32 KiB blocks of chunks ``crc:u32 length:u16 kind:u8
    data``, a block's tail under 7 bytes zero padding; the file opens with a 7-byte ``:W&B`` header), one
    ``wandb_internal_pb2.Record`` per record. It keeps the block being filled in memory and writes it out only
    when the run's stream closes, and ``run.finish()`` does not wait for that: it waits for the exit record to
    be handled, then tells the service to close the stream and returns. So after `finish()` the log may still
    lack its last block, the whole of a small run. Everything the run logged comes before its exit record: the
    log is complete once that record is on disk. Only the last two blocks are read (the exit record begins in
    one of them), so the cost does not grow with the run.
    """
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    try:
        with open(path, 'rb') as file:
            size = file.seek(0, os.SEEK_END)
            start = max(0, ((size - 1) // _LOG_BLOCK - 1) * _LOG_BLOCK)  # a block boundary
            file.seek(start)
            data = file.read()
    except OSError:
        return False
    pos, pending = (_LOG_HEADER if start == 0 else 0), None
    while len(data) - pos >= _LOG_HEADER:
        left = _LOG_BLOCK - pos % _LOG_BLOCK
        if left < _LOG_HEADER:  # too short for a chunk header: padding up to the next block
            pos += left
            continue
        length, kind = struct.unpack_from('<HB', data, pos + 4)
        chunk = data[pos + _LOG_HEADER : pos + _LOG_HEADER + length]
        if kind == 0 or len(chunk) < length:  # not written (yet)
            return False
        pos += _LOG_HEADER + length
        if kind in (_FULL, _FIRST):
            pending = chunk
        elif pending is None:  # the rest of a record that begins before `start`
            continue
        else:
            pending += chunk
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            try:
                record.ParseFromString(pending)
            except DecodeError:  # not a record of this format: never the exit record
                record.Clear()
            if record.WhichOneof('record_type') == 'exit':
                return True
            pending = None
    return False


def wait_for_wandb_log(run: Any, timeout: float = WANDB_LOG_TIMEOUT_S) -> bool:
    """Wait until the finished `run`'s transaction log is complete on disk (`wandb_log_complete`); False (and a
    warning) if it is not within `timeout` seconds. A run without one (``mode='disabled'``, or
    ``x_skip_transaction_log``) has nothing to wait for."""
    path = getattr(getattr(run, 'settings', None), 'sync_file', None)
    if not path or not os.path.exists(path):
        return True
    deadline, pause = time.monotonic() + timeout, 0.005
    while not wandb_log_complete(path):
        if time.monotonic() >= deadline:
            logger.warning('W&B run %s: its transaction log %s is still incomplete after %.0f s', run.id, path, timeout)
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.1)
    return True
