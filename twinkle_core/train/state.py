"""`TrainState`: everything one trainable unit needs to train -- the full model, or one LoRA adapter.

Backend-neutral training machinery (torch only): a model of any backend owns one `TrainState` per trainable unit
(TransformersModel: one; MultiLoraTransformersModel: one per tenant adapter) and delegates the per-tenant API to
it: optimizer, LR scheduler, loss, input processor, template, gradient accumulation, the optimizer-step logic
over *its* parameters (gradient norms correct for sharded DTensor gradients), metrics and the resumable counters.
It never runs the model itself; the backend does.

Gradient accumulation: `loss_scale()` is the factor a model multiplies each micro-batch loss by before backward
(``1 / gradient_accumulation_steps``, or 1 for ``reduction == 'sum'`` losses); `clip_grad_and_step()` steps the
optimizer on every `gradient_accumulation_steps`-th call only. A step whose gradient norm is not finite is
skipped (gradients dropped, weights and optimizer state untouched) and reported as ``skipped``.

A unit stepped without `set_optimizer` gets `DEFAULT_OPTIMIZER` once, with a warning (`optimizer_for_step`).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Iterable

import torch

from twinkle_core.errors import InvalidInputError, TwinkleError
from twinkle_core.metric.base import Metric
from twinkle_core.metric.training import LossMetric, Throughput, TokenAccuracy
from twinkle_core.optimizer.fused import prefer_fused
from twinkle_core.processor import InputProcessor
from twinkle_core.registry import resolve
from twinkle_core.train import grad_norm
from twinkle_core.utils.json import is_json_plain

DEFAULT_LOSS = 'CrossEntropyLoss'
DEFAULT_PROCESSOR = 'CausalLMProcessor'
FULL = 'full'  # the name of the unit that trains all parameters (no adapter)
#: What a unit steps with when no optimizer was set: AdamW, lr 1e-5 training all parameters, 1e-4 an adapter.
DEFAULT_OPTIMIZER = 'AdamW'
DEFAULT_LR_FULL, DEFAULT_LR_ADAPTER = 1e-5, 1e-4
STATE_VERSION = 1
logger = logging.getLogger(__name__)


def spec_name(spec: Any) -> str:
    """A readable name for a component spec (a registry name, a class, a function or an instance)."""
    if isinstance(spec, str):
        return spec
    obj = spec if isinstance(spec, type) or callable(spec) and hasattr(spec, '__name__') else type(spec)
    return f'{getattr(obj, "__module__", "?")}:{getattr(obj, "__qualname__", repr(obj))}'


class TrainState:
    """Training state of one trainable unit named `name` over the parameters `parameters()` returns.

    `parameters` is a callable (evaluated when the optimizer is built and when gradients are clipped) so a
    model may create the unit before its parameters exist. Components are resolved through the registry
    (kinds ``optimizer``, ``lr_scheduler``, ``loss``, ``processor``, ``template``); unknown names raise
    `ComponentNotFoundError` with suggestions.
    """

    def __init__(
        self, name: str, parameters: Callable[[], Iterable[torch.nn.Parameter]], *, gradient_accumulation_steps: int = 1
    ) -> None:
        if gradient_accumulation_steps < 1:
            raise InvalidInputError(f'gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}.')
        self.name = name
        self._parameters = parameters
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: Any = None
        self.loss: Any = resolve('loss', DEFAULT_LOSS)
        self.processor: Any = resolve('processor', DEFAULT_PROCESSOR)
        self.template: Any = None
        self.specs: dict[str, dict[str, Any]] = {
            'loss': {'name': DEFAULT_LOSS, 'kwargs': {}},
            'processor': {'name': DEFAULT_PROCESSOR, 'kwargs': {}},
        }
        self.optimizer_steps = 0  # optimizer steps taken
        self.pending_micro_steps = 0  # clip_grad_and_step calls since the last optimizer step
        self.micro_batches = 0  # forward_backward calls in total
        self.last_grad_norm: float | None = None
        self.metrics: dict[bool, list[Metric]] = {True: self._new_metrics(), False: self._new_metrics()}

    # ---- components ------------------------------------------------------------------------------------
    def parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters of this unit (those with ``requires_grad``)."""
        return [p for p in self._parameters() if p.requires_grad]

    def set_optimizer(self, optimizer: Any, **kwargs: Any) -> None:
        """Build the optimizer over `parameters()` (a name of kind `optimizer`, a class, or a factory taking
        ``params=``). Replacing the optimizer drops the LR scheduler bound to the old one."""
        params = self.parameters()
        if not params:
            raise TwinkleError(
                f'{self.name!r} has no trainable parameters; add an adapter or unfreeze the model before set_optimizer.'
            )
        self.optimizer = resolve('optimizer', optimizer, params=params, **kwargs)
        prefer_fused(self.optimizer)  # CUDA Adam/AdamW without an explicit fused/foreach choice: the fused kernels
        self.lr_scheduler = None
        self.specs.pop('lr_scheduler', None)
        self.specs['optimizer'] = {'name': spec_name(optimizer), 'kwargs': kwargs}

    def set_lr_scheduler(self, scheduler: Any, **kwargs: Any) -> None:
        """Build the LR scheduler (kind `lr_scheduler`) over the optimizer; `set_optimizer` must come first."""
        self.lr_scheduler = resolve('lr_scheduler', scheduler, optimizer=self.require_optimizer(), **kwargs)
        self.specs['lr_scheduler'] = {'name': spec_name(scheduler), 'kwargs': kwargs}

    def set_loss(self, loss: Any, **kwargs: Any) -> None:
        self.loss = resolve('loss', loss, **kwargs)
        self.specs['loss'] = {'name': spec_name(loss), 'kwargs': kwargs}

    def set_processor(self, processor: Any, **kwargs: Any) -> None:
        if processor is InputProcessor:  # the interface itself (the Twinkle documents pass it): the default one
            processor = 'InputProcessor'
        self.processor = resolve('processor', processor, **kwargs)
        self.specs['processor'] = {'name': spec_name(processor), 'kwargs': kwargs}

    def set_template(self, template: Any, **kwargs: Any) -> None:
        self.template = resolve('template', template, **kwargs)
        self.specs['template'] = {
            'name': spec_name(template),
            'kwargs': {k: v for k, v in kwargs.items() if is_json_plain(v)},
        }

    def require_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise TwinkleError(
                f'{self.name!r} has no optimizer yet; call set_optimizer(...) first '
                f'(e.g. set_optimizer("AdamW", lr=1e-4)).'
            )
        return self.optimizer

    def optimizer_for_step(self) -> torch.optim.Optimizer:
        """The optimizer; when none was set, `DEFAULT_OPTIMIZER` is set first (once, with a warning naming it)."""
        if self.optimizer is None:
            lr = DEFAULT_LR_FULL if self.name == FULL else DEFAULT_LR_ADAPTER
            logger.warning(
                '%r is stepped without set_optimizer(...): using %s(lr=%g). Call set_optimizer to choose.',
                self.name,
                DEFAULT_OPTIMIZER,
                lr,
            )
            self.set_optimizer(DEFAULT_OPTIMIZER, lr=lr)
        return self.require_optimizer()

    def update_optimizer(self, **fields: Any) -> None:
        """Set hyper-parameters on every param group (state kept); a field the optimizer lacks raises."""
        optimizer = self.require_optimizer()
        unknown = sorted(set(fields) - set(optimizer.defaults))
        if unknown:
            raise InvalidInputError(
                f'update_optimizer: {type(optimizer).__name__} has no hyper-parameter(s) '
                f'{unknown}; it has {sorted(optimizer.defaults)}.'
            )
        for group in optimizer.param_groups:
            group.update(fields)

    # ---- gradient accumulation and the optimizer step ---------------------------------------------------
    def loss_scale(self) -> float:
        """Factor applied to each micro-batch loss before backward: 1/k, except for ``reduction='sum'`` losses."""
        if getattr(self.loss, 'reduction', None) == 'sum':
            return 1.0
        return 1.0 / self.gradient_accumulation_steps

    def clip_grad_norm(self, max_norm: float | None = 1.0) -> float:
        """Clip this unit's gradients to `max_norm` (None: measure only); returns the norm before clipping."""
        grads = [p for p in self.parameters() if p.grad is not None]
        if not grads:
            return 0.0
        if any(hasattr(p.grad, 'device_mesh') for p in grads):  # FSDP2/TP shards: the norm spans all ranks
            self.last_grad_norm = grad_norm.clip_grad_norm(grads, max_norm)
            return self.last_grad_norm
        limit = math.inf if max_norm is None else float(max_norm)
        norm = torch.nn.utils.clip_grad_norm_(grads, limit, error_if_nonfinite=False)
        self.last_grad_norm = float(norm)
        return self.last_grad_norm

    def step(self) -> None:
        self.optimizer_for_step().step()
        self.optimizer_steps += 1

    def zero_grad(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            for p in self.parameters():
                p.grad = None

    def lr_step(self) -> None:
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()

    def clip_grad_and_step(self, max_norm: float | None = 1.0) -> dict[str, Any]:
        """Count one accumulation micro-step; on every k-th: clip, optimizer step, LR step, zero_grad.

        Returns ``{'stepped': bool, 'skipped': bool, 'step': int, 'grad_norm': float | None, 'lr': float}``.
        A non-finite gradient norm skips the step (gradients dropped) instead of corrupting the weights.
        """
        self.optimizer_for_step()
        self.pending_micro_steps += 1
        result: dict[str, Any] = {'stepped': False, 'skipped': False, 'grad_norm': None}
        if self.pending_micro_steps >= self.gradient_accumulation_steps:
            norm = self.clip_grad_norm(max_norm)
            if math.isfinite(norm):
                self.step()
                self.lr_step()
                result['stepped'] = True
            else:
                result['skipped'] = True
            self.zero_grad()
            self.pending_micro_steps = 0
            result['grad_norm'] = norm
        result.update(step=self.optimizer_steps, lr=self.current_lr())
        return result

    def current_lr(self) -> float:
        if self.optimizer is None:
            return 0.0
        return float(self.optimizer.param_groups[0]['lr'])

    # ---- metrics ------------------------------------------------------------------------------------------
    @staticmethod
    def _new_metrics() -> list[Metric]:
        return [LossMetric(), TokenAccuracy(), Throughput()]

    def record(self, summary: dict[str, Any], *, is_training: bool) -> None:
        """Fold one micro-batch summary (``loss``, ``num_loss_tokens``, ``num_correct``, ``num_tokens``)."""
        if is_training:
            self.micro_batches += 1
        for metric in self.metrics[is_training]:
            metric.accumulate({}, summary)

    def calculate_metric(self, is_training: bool = True) -> dict[str, float]:
        """Metrics of the window since the last call (then reset): loss, token_accuracy, tokens_per_second,
        num_tokens, and for training grad_norm, lr and step."""
        out: dict[str, float] = {}
        for metric in self.metrics[is_training]:
            out.update(metric.calculate())
            metric.reset()
        if is_training:
            if self.last_grad_norm is not None:
                out['grad_norm'] = self.last_grad_norm
            out['lr'] = self.current_lr()
            out['step'] = float(self.optimizer_steps)
        return out

    # ---- configuration and checkpoints ------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """JSON-serialisable description: component names and arguments, accumulation, counters."""
        return {
            'name': self.name,
            'gradient_accumulation_steps': self.gradient_accumulation_steps,
            'optimizer_steps': self.optimizer_steps,
            'num_trainable_parameters': sum(p.numel() for p in self.parameters()),
            **{
                kind: {'name': s['name'], 'kwargs': {k: v for k, v in s['kwargs'].items() if is_json_plain(v)}}
                for kind, s in self.specs.items()
            },
        }

    def state_dict(self) -> dict[str, Any]:
        """Optimizer and scheduler state plus counters: what `load_state_dict` needs for a bit-exact resume."""
        return {
            'version': STATE_VERSION,
            'optimizer': self.optimizer.state_dict() if self.optimizer is not None else None,
            'lr_scheduler': self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            'specs': {k: v for k, v in self.specs.items() if k in ('optimizer', 'lr_scheduler')},
            'optimizer_steps': self.optimizer_steps,
            'pending_micro_steps': self.pending_micro_steps,
            'micro_batches': self.micro_batches,
            'last_grad_norm': self.last_grad_norm,
            'gradient_accumulation_steps': self.gradient_accumulation_steps,
        }

    def load_state_dict(
        self,
        state: dict[str, Any],
        *,
        load_optimizer_state: Callable[[torch.optim.Optimizer, dict[str, Any]], None] | None = None,
    ) -> None:
        """Restore `state_dict()`. An optimizer/scheduler that was saved but is not set yet is rebuilt from its
        recorded registry name and arguments; one set by class or instance must be set again first.
        `load_optimizer_state(optimizer, saved)` loads the saved optimizer state (default
        ``optimizer.load_state_dict``; models with sharded parameters pass a resharding loader)."""
        for kind, setter in (('optimizer', self.set_optimizer), ('lr_scheduler', self.set_lr_scheduler)):
            if state.get(kind) is None or getattr(self, kind) is not None:
                continue
            spec = state['specs'].get(kind)
            if spec is None or ':' in spec['name']:
                raise TwinkleError(
                    f'The checkpoint has {kind} state but {self.name!r} has no {kind}; call '
                    f'set_{kind}(...) as in the original run before loading.'
                )
            setter(spec['name'], **spec['kwargs'])
        if state.get('optimizer') is not None:
            optimizer = self.require_optimizer()
            if load_optimizer_state is None:
                optimizer.load_state_dict(state['optimizer'])
            else:
                load_optimizer_state(optimizer, state['optimizer'])
        if state.get('lr_scheduler') is not None:
            self.lr_scheduler.load_state_dict(state['lr_scheduler'])
        self.optimizer_steps = state['optimizer_steps']
        self.pending_micro_steps = state['pending_micro_steps']
        self.micro_batches = state['micro_batches']
        self.last_grad_norm = state['last_grad_norm']
        self.gradient_accumulation_steps = state['gradient_accumulation_steps']
