"""Experiment trackers as ``twinkle_metrics`` loggers: Weights & Biases and SwanLab.

Like the loggers in `twinkle_core.hooks.loggers` they are registered through the ``twinkle.hooks`` entry points
and are **inert unless configured**: a project name in the constructor or in ``TWINKLE_WANDB_PROJECT`` /
``TWINKLE_SWANLAB_PROJECT``. ``wandb`` / ``swanlab`` are imported at the first metric, never at start-up
(``pip install "twinkle-core[wandb]"`` / ``"twinkle-core[swanlab]"``). Both log the numeric metrics that the other
loggers log, under the same names, at the same step; only the process of rank 0 (``$RANK`` unset or 0) logs.

- `WandbMetricsLogger`: one W&B run per adapter (``context['adapter_name']``; a W&B step must not go back, and
  each adapter counts its own steps), named ``{name}/{adapter}``, in group `name`; keys as in JSONL (``loss``).
  The mode (online / offline) is W&B's own: ``WANDB_MODE``, or ``mode=`` here. `close` returns once every run's
  transaction log (the ``.wandb`` file that ``wandb sync`` uploads) is complete on disk (`wandb_log_complete`).
- `SwanLabMetricsLogger`: one SwanLab run per logger (SwanLab holds one run per process); keys tagged
  ``adapter/metric`` as in TensorBoard (SwanLab keeps a step per key). Mode: ``SWANLAB_MODE`` or ``mode=``
  (``offline`` writes a run directory under `log_dir` that ``swanlab sync`` uploads later).

Extra keyword arguments go to ``wandb.init`` / ``swanlab.init`` unchanged.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from twinkle_core.hooks.loggers import scalar, tag_prefix
from twinkle_core.hooks.manager import hook
from twinkle_core.hooks.wandb_log import wait_for_wandb_log

logger = logging.getLogger(__name__)


def is_main_rank() -> bool:
    """Whether this process is rank 0 of its job (``$RANK`` unset counts as rank 0)."""
    return os.environ.get('RANK', '0').strip() in ('', '0')


def numeric(metrics: dict[str, Any], prefix: str = '') -> dict[str, float]:
    """The metrics that are numbers, keyed ``prefix + name`` (trackers skip the others, as TensorBoard does)."""
    values = {}
    for key, value in metrics.items():
        number = scalar(value)
        if number is not None:
            values[prefix + key] = number
    return values


class _Tracker:
    """What both trackers share: the project switch, the lazy import, the lock, and closing."""

    env_var = ''
    extra = ''

    def __init__(self, project: str | None, name: str | None, **init_kwargs: Any) -> None:
        self.project = project or os.environ.get(self.env_var) or None
        self.name = name
        self.init_kwargs = init_kwargs
        self._lock = threading.Lock()
        self._unavailable = False

    @property
    def active(self) -> bool:
        """Configured, importable (as far as known) and on rank 0."""
        return self.project is not None and not self._unavailable and is_main_rank()

    def _import(self, module: str) -> Any:
        try:
            return __import__(module)
        except ImportError:
            logger.warning(
                '%s is configured (project %r) but %s cannot be imported; run: pip install "twinkle-core[%s]"',
                type(self).__name__,
                self.project,
                module,
                self.extra,
            )
            self._unavailable = True
            return None


class WandbMetricsLogger(_Tracker):
    """Metrics to Weights & Biases, one run per adapter, in `project` (or ``$TWINKLE_WANDB_PROJECT``)."""

    env_var = 'TWINKLE_WANDB_PROJECT'
    extra = 'wandb'

    def __init__(
        self,
        project: str | None = None,
        *,
        name: str | None = None,
        dir: str | os.PathLike[str] | None = None,  # noqa: A002 - wandb.init's own name
        mode: str | None = None,
        **init_kwargs: Any,
    ) -> None:
        super().__init__(project, name, **init_kwargs)
        self.dir = str(dir) if dir is not None else None
        self.mode = mode
        self.runs: dict[str, Any] = {}  # adapter name ('' when none) -> its wandb Run

    def _run(self, context: dict[str, Any]) -> Any:
        adapter = str((context or {}).get('adapter_name') or '')
        run = self.runs.get(adapter)
        if run is None:
            wandb = self._import('wandb')
            if wandb is None:
                return None
            group = self.name or self.project
            kwargs: dict[str, Any] = {
                'project': self.project,
                'group': group,
                'name': f'{group}/{adapter}' if adapter else group,
                'config': {k: v for k, v in (context or {}).items() if isinstance(v, (str, int, float, bool))},
                'reinit': 'create_new',  # several adapters: several live runs in this process
                **({'dir': self.dir} if self.dir else {}),
                **({'mode': self.mode} if self.mode else {}),
                **self.init_kwargs,
            }
            run = self.runs[adapter] = wandb.init(**kwargs)
        return run

    @hook
    def twinkle_metrics(self, step: int, metrics: dict[str, Any], context: dict[str, Any]) -> None:
        if not self.active:
            return
        values = numeric(metrics)
        if not values:
            return
        with self._lock:
            run = self._run(context)
            if run is not None:
                run.log(values, step=int(step))

    def close(self) -> None:
        """Finish every run (W&B writes its summary and, online, uploads the rest), and wait until each run's
        transaction log is complete on disk: `run.finish()` returns before wandb-core has written it out."""
        with self._lock:
            runs, self.runs = list(self.runs.values()), {}
        for run in runs:
            run.finish()
        for run in runs:
            wait_for_wandb_log(run)


class SwanLabMetricsLogger(_Tracker):
    """Metrics to SwanLab, one run, in `project` (or ``$TWINKLE_SWANLAB_PROJECT``); keys ``adapter/metric``."""

    env_var = 'TWINKLE_SWANLAB_PROJECT'
    extra = 'swanlab'

    def __init__(
        self,
        project: str | None = None,
        *,
        name: str | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        mode: str | None = None,
        **init_kwargs: Any,
    ) -> None:
        super().__init__(project, name, **init_kwargs)
        self.log_dir = str(log_dir) if log_dir is not None else None
        self.mode = mode
        self.run: Any = None

    def _get_run(self) -> Any:
        if self.run is None:
            swanlab = self._import('swanlab')
            if swanlab is None:
                return None
            kwargs: dict[str, Any] = {
                'project': self.project,
                **({'name': self.name} if self.name else {}),
                **({'log_dir': self.log_dir} if self.log_dir else {}),
                **({'mode': self.mode} if self.mode else {}),
                **self.init_kwargs,
            }
            self.run = swanlab.init(**kwargs)
        return self.run

    @hook
    def twinkle_metrics(self, step: int, metrics: dict[str, Any], context: dict[str, Any]) -> None:
        if not self.active:
            return
        values = numeric(metrics, tag_prefix(context))
        if not values:
            return
        with self._lock:
            run = self._get_run()
            if run is not None:
                run.log(values, step=int(step))

    def close(self) -> None:
        """Finish the run (SwanLab flushes its run file)."""
        with self._lock:
            run, self.run = self.run, None
        if run is not None:
            run.finish()
