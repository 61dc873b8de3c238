"""`TrainStateMethods`: the `Model` methods that `TransformersModel` and `MultiLoraTransformersModel` share.

Both keep a `TrainState` per trainable unit; every per-tenant configuration and optimizer call only finds that
state and forwards to it, so it is written once here.
"""
from __future__ import annotations

from typing import Any

from twinkle_core.errors import TwinkleError
from twinkle_core.hooks.emit import emit_metrics
from twinkle_transformers.train_state import TrainState


class TrainStateMethods:
    """Mixin (listed before `Model`) forwarding the per-adapter `Model` methods to a `TrainState`.

    The host class provides `_name(adapter_name)` (the adapter a call addresses) and `_state(adapter_name)` (its
    `TrainState`; raises for an unknown adapter), plus the attributes `model_id`, `model_dir`, `tokenizer` and
    `_pending` (the forward waiting for `calculate_loss` / `backward`, or None).
    """

    model_id: str
    model_dir: Any
    tokenizer: Any
    _pending: Any

    def _name(self, adapter_name: str | None) -> str | None:
        raise NotImplementedError

    def _state(self, adapter_name: str | None) -> TrainState:
        raise NotImplementedError

    # ---- configuration ---------------------------------------------------------------------------------------
    def set_optimizer(self, optimizer: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._state(adapter_name).set_optimizer(optimizer, **kwargs)

    def set_lr_scheduler(self, scheduler: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._state(adapter_name).set_lr_scheduler(scheduler, **kwargs)

    def set_loss(self, loss: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._state(adapter_name).set_loss(loss, **kwargs)

    def set_processor(self, processor: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._state(adapter_name).set_processor(processor, **kwargs)

    def set_template(self, template: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        """Template by name (kind ``template``); named templates get the model's tokenizer by default."""
        if isinstance(template, (str, type)):
            kwargs.setdefault('model_id_or_tokenizer', self.tokenizer or self.model_dir)
        self._state(adapter_name).set_template(template, **kwargs)

    # ---- optimizer step and metrics --------------------------------------------------------------------------
    def clip_grad_and_step(self, max_norm: float | None = 1.0, *, adapter_name: str | None = None,
                           **kwargs: Any) -> dict[str, Any]:
        return self._state(adapter_name).clip_grad_and_step(max_norm)

    def clip_grad_norm(self, max_norm: float | None = 1.0, *, adapter_name: str | None = None) -> float:
        return self._state(adapter_name).clip_grad_norm(max_norm)

    def step(self, *, adapter_name: str | None = None) -> None:
        self._state(adapter_name).step()

    def zero_grad(self, *, adapter_name: str | None = None) -> None:
        self._state(adapter_name).zero_grad()

    def lr_step(self, *, adapter_name: str | None = None) -> None:
        self._state(adapter_name).lr_step()

    def calculate_metric(self, is_training: bool = True, *, adapter_name: str | None = None) -> dict[str, Any]:
        """The adapter's metrics since its last call (then reset); also sent to every ``twinkle_metrics`` hook."""
        name = self._name(adapter_name)
        state = self._state(name)
        metrics = state.calculate_metric(is_training)
        emit_metrics(state.optimizer_steps, metrics, {'adapter_name': name, 'is_training': is_training,
                                                      'model_id': self.model_id})
        return metrics

    def _require_pending(self, what: str) -> Any:
        if self._pending is None:
            raise TwinkleError(f'{what}() needs a preceding forward(inputs=...) whose loss was not backpropagated yet.')
        return self._pending
