"""Metrics loggers shipped with twinkle-core, as ``twinkle_metrics`` hook implementations.

They are registered through the ``twinkle.hooks`` entry-point group like any plugin, and each one is inert
unless configured, so installing twinkle-core never prints or writes anything on its own:

- `ConsoleMetricsLogger`: logs one line per step on the ``twinkle.metrics`` logger at INFO. Quiet by default
  (Python logging shows WARNING+ only); ``TWINKLE_CONSOLE_METRICS=1`` attaches a stderr handler, or configure
  the ``twinkle.metrics`` logger yourself. ``TWINKLE_CONSOLE_METRICS=0`` silences it even when logging is on.
- `JsonlMetricsLogger`: appends ``{"step", "time", "context", "metrics"}`` lines to the path given to the
  constructor or in ``TWINKLE_METRICS_JSONL``; does nothing without a path.
- `TensorBoardMetricsLogger`: writes scalars under ``TWINKLE_TENSORBOARD_DIR`` (or the constructor's
  ``log_dir``) when ``torch.utils.tensorboard`` (or ``tensorboardX``) can be imported; otherwise inert. The
  writer (and torch) is imported at the first metric, never at start-up.

Non-numeric metric values are skipped by TensorBoard and stringified in JSONL. Tags are prefixed with
``context['adapter_name']`` when present, so tenants of one multi-LoRA run stay apart.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from twinkle_core.hooks.manager import hook
from twinkle_core.utils.json import to_json

METRICS_LOGGER = 'twinkle.metrics'


def scalar(value: Any) -> float | None:
    """`value` as a float (bool/int/float, one-element tensors and numpy values), or None when it is not one."""
    if isinstance(value, (bool, int, float)):
        return float(value)
    item = getattr(value, 'item', None)
    if not callable(item):
        return None
    try:
        numel = getattr(value, 'numel', None)
        count = numel() if callable(numel) else getattr(value, 'size', None)
        return float(item()) if count == 1 else None
    except (TypeError, ValueError, RuntimeError):
        return None


def tag_prefix(context: dict[str, Any]) -> str:
    """``'adapter/'`` for a context naming an adapter, else ``''`` (how tags keep tenants apart)."""
    adapter = context.get('adapter_name') if context else None
    return f'{adapter}/' if adapter else ''


def _flag(name: str) -> str:
    return os.environ.get(name, '').strip().lower()


class ConsoleMetricsLogger:
    """One line per step on logger ``twinkle.metrics`` (INFO). See the module docstring for how to see it."""

    def __init__(self, stream: Any = None) -> None:
        self.log = logging.getLogger(METRICS_LOGGER)
        flag = _flag('TWINKLE_CONSOLE_METRICS')
        self.disabled = flag in ('0', 'false', 'no', 'off')
        wanted = (stream is not None or flag in ('1', 'true', 'yes', 'on')) and not self.disabled
        if wanted and not any(getattr(h, '_twinkle_console', False) for h in self.log.handlers):
            handler = logging.StreamHandler(stream or sys.stderr)
            handler.setFormatter(logging.Formatter('%(message)s'))
            handler._twinkle_console = True  # type: ignore[attr-defined]
            self.log.addHandler(handler)
            self.log.setLevel(logging.INFO)
            self.log.propagate = False  # printed once, even when the root logger also shows INFO
            self._handler = handler

    @hook
    def twinkle_metrics(self, step: int, metrics: dict[str, Any], context: dict[str, Any]) -> None:
        if self.disabled or not self.log.isEnabledFor(logging.INFO):
            return
        parts = []
        for key, value in metrics.items():
            number = scalar(value)
            parts.append(f'{key}={number:.6g}' if number is not None else f'{key}={value}')
        self.log.info('[%sstep %d] %s', tag_prefix(context), step, ' '.join(parts))

    def close(self) -> None:
        handler = getattr(self, '_handler', None)
        if handler is not None:
            self.log.removeHandler(handler)
            self.log.propagate = True


class JsonlMetricsLogger:
    """Appends one JSON object per `twinkle_metrics` call to `path` (or ``$TWINKLE_METRICS_JSONL``)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        path = path or os.environ.get('TWINKLE_METRICS_JSONL')
        self.path = Path(path) if path else None
        self._lock = threading.Lock()

    @hook
    def twinkle_metrics(self, step: int, metrics: dict[str, Any], context: dict[str, Any]) -> None:
        if self.path is None:
            return
        values: dict[str, float | str] = {}
        for key, value in metrics.items():
            number = scalar(value)
            if number is None:
                values[key] = str(value)
            else:  # JSON has no NaN/inf: write those as strings
                values[key] = number if math.isfinite(number) else str(number)
        record = {'step': step, 'time': time.time(), 'context': to_json(context or {}), 'metrics': values}
        line = json.dumps(record, sort_keys=True) + '\n'
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open('a', encoding='utf-8') as f:
                f.write(line)


class TensorBoardMetricsLogger:
    """Scalars to TensorBoard under `log_dir` (or ``$TWINKLE_TENSORBOARD_DIR``); inert without one."""

    def __init__(self, log_dir: str | os.PathLike[str] | None = None) -> None:
        log_dir = log_dir or os.environ.get('TWINKLE_TENSORBOARD_DIR')
        self.log_dir = Path(log_dir) if log_dir else None
        self._writer: Any = None
        self._unavailable = False

    @property
    def active(self) -> bool:
        return self.log_dir is not None and not self._unavailable

    def _get_writer(self) -> Any:
        if self._writer is None and self.active:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                try:
                    from tensorboardX import SummaryWriter  # type: ignore[no-redef]
                except ImportError:
                    logging.getLogger(__name__).warning(
                        'TWINKLE_TENSORBOARD_DIR is set but neither torch.utils.tensorboard nor tensorboardX can be '
                        'imported; run: pip install "twinkle-core[tensorboard]"'
                    )
                    self._unavailable = True
                    return None
            self._writer = SummaryWriter(log_dir=str(self.log_dir))
        return self._writer

    @hook
    def twinkle_metrics(self, step: int, metrics: dict[str, Any], context: dict[str, Any]) -> None:
        writer = self._get_writer()
        if writer is None:
            return
        prefix = tag_prefix(context)
        for key, value in metrics.items():
            number = scalar(value)
            if number is not None:
                writer.add_scalar(prefix + key, number, global_step=step)
        writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
