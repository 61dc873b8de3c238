"""Per-model metrics loggers: the `loggers` key of a model in the config file (e.g. ``[wandb, {name: jsonl, path:
...}]``), fed with every training run's metrics on that model.

The same loggers as in local training (`twinkle_core.hooks.select`: console, jsonl, tensorboard, wandb, swanlab,
or a plugin's ``<name>_metrics``), built once per hosted model in the service process (whatever the deployment:
every host call's result comes back here). They get what the service records per step for its console
(`service.training.TrainingOperations._record`): ``loss:sum`` and the backend's ``name:reduction`` metrics of each
``forward_backward``, ``learning_rate`` / ``grad_norm:mean`` of each ``optim_step`` -- the names the Tinker API
returns -- at the run's step. The context names the training run (``adapter_name``: its model id) and the base
model (``model_id``), so the W&B logger keeps one W&B run per training run and the others tag keys with it. A
logger that raises is logged and skipped, as in `twinkle_core.hooks.call_each`.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

from twinkle_core.hooks.select import build_logger

logger = logging.getLogger(__name__)

__all__ = ['ModelLoggers']


class ModelLoggers:
    """Base model name -> its loggers, built from the config's ``loggers`` specs (ValueError naming the
    installed loggers for an unknown name, at start-up)."""

    def __init__(self, specs: Mapping[str, Iterable[Any]]) -> None:
        self.loggers = {base: [build_logger(spec) for spec in entries] for base, entries in specs.items() if entries}

    def record(self, base_model: str, model_id: str, step: int, metrics: Mapping[str, Any]) -> None:
        """Log one step's `metrics` of training run `model_id` on `base_model` (a no-op without loggers)."""
        context = {'adapter_name': model_id, 'model_id': base_model, 'is_training': True}
        for obj in self.loggers.get(base_model, ()):
            try:
                obj.twinkle_metrics(step=step, metrics=dict(metrics), context=dict(context))
            except Exception as exc:  # noqa: BLE001 - a broken logger never fails a training request
                logger.warning(
                    'metrics logger %s raised and is skipped: %s: %s', type(obj).__name__, type(exc).__name__, exc
                )

    def close(self) -> None:
        """Close every logger that can be closed (W&B / SwanLab finish their runs)."""
        for entries in self.loggers.values():
            for obj in entries:
                close = getattr(obj, 'close', None)
                if callable(close):
                    try:
                        close()
                    except Exception:  # noqa: BLE001 - closing the others matters more
                        logger.exception('closing metrics logger %s failed', type(obj).__name__)
