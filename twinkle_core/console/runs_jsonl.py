"""Local runs as the console shows them: the JSONL metrics files under a log directory.

Local training writes one JSON object per logged step (`hooks.loggers.JsonlMetricsLogger`: ``{"step", "time",
"context", "metrics"}``). Every ``*.jsonl`` file under the directory whose lines look like that is a run, named by
its path relative to the directory (``sft_lora/metrics.jsonl`` is the run ``sft_lora``; any other file name stays
in the name). Lines that are not such records (a half-written last line, another tool's JSONL) are skipped."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

__all__ = ['METRICS_FILE', 'RUNNING_WITHIN_S', 'find_runs', 'read_series', 'run_file', 'summary']

METRICS_FILE = 'metrics.jsonl'
RUNNING_WITHIN_S = 120.0  # a run whose file changed this recently is shown as running
MAX_FILES = 500


def _run_name(logdir: Path, path: Path) -> str:
    rel = path.relative_to(logdir)
    if rel.name == METRICS_FILE:
        return rel.parent.as_posix() if rel.parent != Path('.') else logdir.resolve().name
    return rel.with_suffix('').as_posix()


def _records(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding='utf-8', errors='replace')
    except OSError:
        return out
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get('metrics'), dict) and 'step' in record:
            out.append(record)
    return out


def find_runs(logdir: str | Path) -> dict[str, Path]:
    """Run name -> its JSONL file, for every metrics file under `logdir` (see the module docstring)."""
    root = Path(logdir)
    runs: dict[str, Path] = {}
    for path in sorted(root.rglob('*.jsonl'))[:MAX_FILES]:
        if path.is_file() and _looks_like_metrics(path):
            runs[_run_name(root, path)] = path
    return runs


def _looks_like_metrics(path: Path) -> bool:
    try:
        with path.open(encoding='utf-8', errors='replace') as f:
            first = json.loads(f.readline() or 'null')
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(first, dict) and 'step' in first and isinstance(first.get('metrics'), dict)


def run_file(logdir: str | Path, name: str) -> Path | None:
    """The file of run `name` under `logdir`, or None (names come only from `find_runs`: no path is built)."""
    return find_runs(logdir).get(name)


def summary(name: str, path: Path) -> dict[str, Any]:
    """The runs table's row for a run: its name, last step, when it last wrote, and whether it still does."""
    records = _records(path)
    updated = path.stat().st_mtime if path.exists() else None
    running = updated is not None and time.time() - updated < RUNNING_WITHIN_S
    return {
        'id': name,
        'name': name,
        'url': None,
        'last_step': max((int(r['step']) for r in records), default=None),
        'points': len(records),
        'updated': updated,
        'status': 'running' if running else 'finished',
    }


def read_series(path: Path) -> dict[str, list[list[float]]]:
    """Metric name -> [steps, values] of one run, in step order; non-numeric and non-finite values are left out."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for record in sorted(_records(path), key=lambda r: float(r['step'])):
        for key, value in record['metrics'].items():
            number = _number(value)
            if number is None:
                continue
            xs, ys = series.setdefault(str(key), ([], []))
            xs.append(float(record['step']))
            ys.append(number)
    return {k: [xs, ys] for k, (xs, ys) in series.items()}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
