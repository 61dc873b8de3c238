"""`TrainStateMethods`: the `Model` methods every backend that keeps a `TrainState` per trainable unit shares
(TransformersModel, MultiLoraTransformersModel; a second backend mixes it in the same way). Every per-tenant
configuration and optimizer call only finds that state and forwards to it, so it is written once here. What the
mixin needs from its host model is declared by the protocol `TrainStateHost`, the type of `self` in its methods.

Failures are reported here too: every training-step and checkpoint method of both models is wrapped in
`reports_failure(stage)`. An exception escaping such a call fires the ``twinkle_failure`` hook once (for the
outermost wrapped call of that model: a failing ``forward`` inside ``forward_backward`` is reported as
``'forward_backward'``) and is then re-raised unchanged. The hook's context is `failure_context`:
``{'where', 'model_id', 'model_class', 'adapter_name', 'stage', 'step'}``. A notifier that raises (anything,
even ``SystemExit``) is logged and skipped; it never replaces the training error. Errors a
call *returns* (``return_errors=True`` of `MultiLoraTransformersModel`) are data for its caller and fire nothing.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable, Protocol, TypeVar

from twinkle_core.errors import TwinkleError
from twinkle_core.hooks.emit import emit_failure, emit_metrics
from twinkle_core.model.base import component_arg
from twinkle_core.train.state import TrainState

logger = logging.getLogger(__name__)
_F = TypeVar('_F', bound=Callable[..., Any])
_calls = threading.local()  # per thread: `models` (ids of models inside a wrapped call), `reported` (exceptions)


def reports_failure(stage: str) -> Callable[[_F], _F]:
    """Wrap a model method (``adapter_name`` passed as a keyword) so that an exception escaping it fires
    ``twinkle_failure`` with `failure_context(stage, ...)`, once per exception and model, then propagates as is."""

    def decorator(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            models = _calls.__dict__.setdefault('models', [])
            reported = _calls.__dict__.setdefault('reported', [])
            outermost = id(self) not in models
            models.append(id(self))
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                if outermost and not any(e is exc for e in reported):
                    reported.append(exc)
                    report_failure(self, exc, stage, kwargs.get('adapter_name'))
                raise
            finally:
                models.pop()
                if not models:
                    reported.clear()  # drop the references (and their tracebacks' tensors) after the call

        return wrapper  # type: ignore[return-value]

    return decorator


def failure_context(model: Any, stage: str, adapter_name: str | None, exc: BaseException) -> dict[str, Any]:
    """``{'where', 'model_id', 'model_class', 'adapter_name', 'stage', 'step'}``: who reports (the model's
    `backend` attribute, default ``'transformers'``; the server reports its work items with ``'where':
    'server'``), the model, the adapter the failed call addressed (None: full-parameter training, or a mixed
    multi-tenant call), the method that failed and the adapter's optimizer steps taken so far (the ``step`` of its
    ``twinkle_metrics``; None when unknown)."""
    name = adapter_name
    reported = getattr(exc, 'adapter_name', None)  # e.g. the tenant of a TenantStepError
    if name is None and isinstance(reported, str):
        name = reported
    if name is None:
        try:
            name = model._name(None)  # the model's only adapter, or the one of `with model.adapter(...)`
        except Exception:  # noqa: BLE001 - no single adapter
            name = None
    try:
        step: int | None = int(model._state(name).optimizer_steps)
    except Exception:  # noqa: BLE001 - unknown adapter
        step = None
    return {
        'where': getattr(model, 'backend', 'transformers'),
        'model_id': getattr(model, 'model_id', None),
        'model_class': type(model).__name__,
        'adapter_name': name,
        'stage': stage,
        'step': step,
    }


def report_failure(model: Any, exc: BaseException, stage: str, adapter_name: str | None = None) -> None:
    """Fire ``twinkle_failure`` for `exc`; never raises (a failing notifier is logged, not propagated)."""
    try:
        emit_failure(exc, failure_context(model, stage, adapter_name, exc))
    except BaseException as hook_exc:  # noqa: BLE001 - must never mask the error being reported
        logger.warning(
            'twinkle_failure notification for %s.%s failed and is skipped: %s: %s',
            type(model).__name__,
            stage,
            type(hook_exc).__name__,
            hook_exc,
        )


class TrainStateHost(Protocol):
    """What `TrainStateMethods` relies on in the model it is mixed into: `_name(adapter_name)` (the adapter a call
    addresses), `_state(adapter_name)` (its `TrainState`; raises for an unknown adapter), the attributes
    `model_id`, `model_dir` and `tokenizer`, `_pending` (the forward waiting for `calculate_loss` / `backward`, or
    None) and `_eval_loss` (the last `forward_only`'s loss)."""

    model_id: str
    model_dir: Any
    tokenizer: Any
    _pending: Any
    _eval_loss: Any

    def _name(self, adapter_name: str | None) -> str | None: ...

    def _state(self, adapter_name: str | None) -> TrainState: ...


class TrainStateMethods:
    """Mixin (listed before `Model`) forwarding the per-adapter `Model` methods to a `TrainState`; its host model
    provides what `TrainStateHost` declares."""

    # ---- configuration ---------------------------------------------------------------------------------------
    def set_optimizer(
        self: TrainStateHost,
        optimizer: Any = None,
        *,
        optimizer_cls: Any = None,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        optimizer = component_arg('set_optimizer', optimizer, 'optimizer_cls', optimizer_cls)
        self._state(adapter_name).set_optimizer(optimizer, **kwargs)

    def set_lr_scheduler(
        self: TrainStateHost,
        scheduler: Any = None,
        *,
        scheduler_cls: Any = None,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        scheduler = component_arg('set_lr_scheduler', scheduler, 'scheduler_cls', scheduler_cls)
        self._state(adapter_name).set_lr_scheduler(scheduler, **kwargs)

    def set_loss(self: TrainStateHost, loss: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._state(adapter_name).set_loss(loss, **kwargs)

    def set_processor(self: TrainStateHost, processor: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._state(adapter_name).set_processor(processor, **kwargs)

    def set_template(
        self: TrainStateHost, template: Any, *, adapter_name: str | None = None, model_id: Any = None, **kwargs: Any
    ) -> None:
        """Template by name (kind ``template``); named templates get `model_id` (a model dir or tokenizer), by
        default the model's tokenizer."""
        if isinstance(template, (str, type)):
            kwargs.setdefault('model_id_or_tokenizer', model_id or self.tokenizer or self.model_dir)
        self._state(adapter_name).set_template(template, **kwargs)

    # ---- optimizer step and metrics --------------------------------------------------------------------------
    def update_optimizer(self: TrainStateHost, *, adapter_name: str | None = None, **fields: Any) -> None:
        self._state(adapter_name).update_optimizer(**fields)

    @reports_failure('clip_grad_and_step')
    def clip_grad_and_step(
        self: TrainStateHost, max_norm: float | None = 1.0, *, adapter_name: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        return self._state(adapter_name).clip_grad_and_step(max_norm)

    @reports_failure('clip_grad_norm')
    def clip_grad_norm(self: TrainStateHost, max_norm: float | None = 1.0, *, adapter_name: str | None = None) -> float:
        return self._state(adapter_name).clip_grad_norm(max_norm)

    @reports_failure('step')
    def step(self: TrainStateHost, *, adapter_name: str | None = None) -> None:
        self._state(adapter_name).step()

    @reports_failure('zero_grad')
    def zero_grad(self: TrainStateHost, *, adapter_name: str | None = None) -> None:
        self._state(adapter_name).zero_grad()

    @reports_failure('lr_step')
    def lr_step(self: TrainStateHost, *, adapter_name: str | None = None) -> None:
        self._state(adapter_name).lr_step()

    def calculate_metric(
        self: TrainStateHost, is_training: bool = True, *, adapter_name: str | None = None
    ) -> dict[str, Any]:
        """The adapter's metrics since its last call (then reset); also sent to every ``twinkle_metrics`` hook."""
        name = self._name(adapter_name)
        state = self._state(name)
        metrics = state.calculate_metric(is_training)
        emit_metrics(
            state.optimizer_steps,
            metrics,
            {'adapter_name': name, 'is_training': is_training, 'model_id': self.model_id},
        )
        return metrics

    def _require_pending(self: TrainStateHost, what: str) -> Any:
        if self._pending is None:
            raise TwinkleError(
                f'{what}() needs a preceding forward(inputs=...) whose loss was not backpropagated yet'
                + (' (or, for calculate_loss, a forward_only with labels).' if what == 'calculate_loss' else '.')
            )
        return self._pending

    #: the loss of the last `forward_only` (float, or {adapter: float} when mixed); what `calculate_loss()` returns
    #: right after it (the evaluation loop of the Twinkle documents). Cleared by `forward`.
    _eval_loss: Any = None

    def _loss_of_last_forward_only(self: TrainStateHost) -> Any:
        """The last `forward_only`'s loss when no `forward` is pending since; None otherwise."""
        return self._eval_loss if self._pending is None else None
