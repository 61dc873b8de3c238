"""The optimizer side of `MegatronModel`: Megatron's optimizer stack behind twinkle's `TrainState`.

Gradients live in Megatron DDP's grad buffers (``param.main_grad``), so the step is Megatron's:
`finalize_model_grads` (data-parallel all-reduce or reduce-scatter, the tensor-parallel sum of q/k-norm and
sequence-parallel norm grads, the tied-embedding sum across pipeline stages), then the Megatron optimizer's
gradient norm (over every model-parallel rank, each shard counted once), clipping and inner step. With
``distributed_optimizer=True`` that optimizer is Megatron's `DistributedOptimizer` (ZeRO-1: optimizer state
and master weights sharded over the data-parallel ranks, parameters all-gathered after the step).

Optimizers are named as elsewhere in twinkle: ``'AdamW'`` (Megatron's ``adam``: decoupled weight decay, torch
AdamW on CPU, TransformerEngine/Apex FusedAdam on GPUs when installed), ``'Adam'`` (the same with
``weight_decay=0``) and ``'SGD'``. Megatron applies weight decay to weight matrices only, not to norms and
biases. The LR scheduler drives the inner torch optimizer, so every twinkle LR scheduler works.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterable

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.optimizer.fused import prefer_fused
from twinkle_core.train.state import TrainState, spec_name
from twinkle_megatron.cpu_compat import tensors_as_cuda

_ADAM = {'adamw': 'adam', 'adam': 'adam', 'sgd': 'sgd'}


def optimizer_config(name: Any, kwargs: dict[str, Any], *, distributed: bool, dtype: torch.dtype) -> Any:
    """`megatron.core.optimizer.OptimizerConfig` for a twinkle optimizer name and its torch-style kwargs."""
    from megatron.core.optimizer import OptimizerConfig

    key = name.lower() if isinstance(name, str) else getattr(name, '__name__', '').lower()
    if key not in _ADAM:
        raise InvalidInputError(
            f'MegatronModel builds Megatron optimizers: AdamW, Adam or SGD; got {name!r}. '
            f"(Other torch optimizers cannot drive Megatron's sharded grad buffers.)"
        )
    args = dict(kwargs)
    unknown = sorted(set(args) - {'lr', 'weight_decay', 'betas', 'eps', 'momentum'})
    if unknown:
        raise InvalidInputError(
            f'set_optimizer({name!r}): MegatronModel does not take {unknown}; it takes lr, '
            f'weight_decay, betas, eps (Adam) and momentum (SGD).'
        )
    if key == 'adam' and args.get('weight_decay', 0.0):
        raise InvalidInputError(
            'set_optimizer("Adam", weight_decay=...): Megatron\'s Adam decays weights '
            'decoupled (AdamW); ask for "AdamW" instead.'
        )
    if key == 'sgd' and distributed:
        raise InvalidInputError(
            "set_optimizer('SGD'): Megatron's distributed optimizer (ZeRO-1, the default when dp > 1) steps Adam "
            'only; use AdamW / Adam, or build the model with distributed_optimizer=False.'
        )
    betas = args.pop('betas', (0.9, 0.999))
    fp16 = dtype in (torch.bfloat16, torch.float16)
    return OptimizerConfig(
        optimizer=_ADAM[key],
        lr=float(args.get('lr', 1e-3)),
        weight_decay=float(args.get('weight_decay', 0.01 if key == 'adamw' else 0.0)),
        adam_beta1=float(betas[0]),
        adam_beta2=float(betas[1]),
        adam_eps=float(args.get('eps', 1e-8)),
        sgd_momentum=float(args.get('momentum', 0.0)),
        use_distributed_optimizer=distributed,
        clip_grad=0.0,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        params_dtype=dtype if fp16 else torch.float32,
    )


class ParamGroupsView(torch.optim.Optimizer):
    """One torch `Optimizer` face over several: the concatenation of their param groups (the same dicts) and
    states. Megatron chains a dense and an expert optimizer for MoE models under expert parallelism; LR
    schedulers and `update_optimizer` set ``lr`` & co. on these shared dicts, so both follow. It never steps
    (Megatron's optimizer does)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:  # super().__init__ is deliberately not called
        self.optimizers = optimizers
        self.defaults = optimizers[0].defaults
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Read live: loading a state dict replaces an optimizer's group dicts."""
        return [group for o in self.optimizers for group in o.param_groups]

    @property
    def state(self) -> dict[Any, Any]:  # type: ignore[override]
        return {p: s for o in self.optimizers for p, s in o.state.items()}

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        raise RuntimeError('ParamGroupsView does not step; the Megatron optimizer does.')


def inner_optimizer(megatron_optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer under a Megatron optimizer (a `ParamGroupsView` over a chain of several)."""
    chained = getattr(megatron_optimizer, 'chained_optimizers', None)
    if chained is not None and len(chained) > 1:
        return ParamGroupsView([c.optimizer for c in chained])
    return megatron_optimizer.optimizer


class MegatronTrainState(TrainState):
    """A `TrainState` whose optimizer is a Megatron optimizer over DDP-wrapped model `chunks`.

    ``self.optimizer`` is the inner torch optimizer (what LR schedulers, `update_optimizer` and the metrics
    read); ``self.megatron_optimizer`` steps it. `distributed`: use the distributed optimizer."""

    def __init__(
        self,
        name: str,
        parameters: Callable[[], Iterable[torch.nn.Parameter]],
        *,
        chunks: list[Any],
        distributed: bool,
        dtype: torch.dtype,
        gradient_accumulation_steps: int = 1,
        scope: Callable[[], ContextManager[Any]] = nullcontext,
        prepare: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(name, parameters, gradient_accumulation_steps=gradient_accumulation_steps)
        self.chunks = chunks
        self.scope = scope  # entered while the optimizer is built and the grads reduced (adapter_scope.only_trainable)
        self.prepare = prepare  # called before the optimizer is built (wraps `chunks` in Megatron DDP)
        self.distributed = distributed
        self.dtype = dtype
        self.megatron_optimizer: Any = None
        self._grads_ready = False

    def set_optimizer(self, optimizer: Any, **kwargs: Any) -> None:
        from megatron.core.optimizer import get_megatron_optimizer

        config = optimizer_config(optimizer, kwargs, distributed=self.distributed, dtype=self.dtype)
        self.prepare()
        with self.scope(), tensors_as_cuda():
            self.megatron_optimizer = get_megatron_optimizer(config, self.chunks)
        self.optimizer = inner_optimizer(self.megatron_optimizer)
        for torch_optimizer in getattr(self.megatron_optimizer, 'chained_optimizers', None) or [self.optimizer]:
            prefer_fused(getattr(torch_optimizer, 'optimizer', torch_optimizer))  # torch AdamW without TE/Apex
        self.lr_scheduler = None
        self.specs.pop('lr_scheduler', None)
        self.specs['optimizer'] = {'name': spec_name(optimizer), 'kwargs': kwargs}

    def _finalize(self) -> None:
        """Reduce the accumulated grads (once per step) and hand them to the optimizer."""
        if not self._grads_ready:
            from megatron.core.distributed import finalize_model_grads

            with self.scope():
                finalize_model_grads(self.chunks)
            with tensors_as_cuda():
                self.megatron_optimizer.prepare_grads()
            self._grads_ready = True

    def clip_grad_norm(self, max_norm: float | None = 1.0) -> float:
        """The gradient norm over every model-parallel rank (each shard counted once; dense and expert
        optimizers together), then, given `max_norm`, clip every optimizer's gradients by it."""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        self.require_optimizer()
        self._finalize()
        with tensors_as_cuda():
            norm = float(self.megatron_optimizer.get_grad_norm())
            if max_norm is not None:
                for optimizer in getattr(self.megatron_optimizer, 'chained_optimizers', [self.megatron_optimizer]):
                    params = optimizer.get_parameters()
                    if params and not getattr(optimizer, 'is_stub_optimizer', False):
                        clip_grad_by_total_norm_fp32(
                            params,
                            float(max_norm),
                            norm,
                            optimizer.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8,
                        )
        self.last_grad_norm = norm
        return norm

    def step(self) -> None:
        self.optimizer_for_step()
        self._finalize()
        with tensors_as_cuda():
            self.megatron_optimizer.step_with_ready_grads()
        self.optimizer_steps += 1

    def zero_grad(self) -> None:
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        if self.megatron_optimizer is not None:
            self.megatron_optimizer.zero_grad(set_to_none=True)
        self._grads_ready = False

    def state_dict(self) -> dict[str, Any]:
        """`TrainState.state_dict` with the optimizer's state left to `shard_state` (per model-parallel rank); the
        entry only records that there is one, so a resume rebuilds the optimizer before loading the shards."""
        optimizer, self.optimizer = self.optimizer, None
        try:
            state = super().state_dict()
        finally:
            self.optimizer = optimizer
        state['optimizer'] = {'sharded': True} if optimizer is not None else None
        state['lr_scheduler'] = self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None
        return state

    def save_shard(self, optimizer_file: Any, parameter_file: Any, *, write: bool) -> None:
        """Write this model-parallel rank's optimizer state to `optimizer_file` (when `write`: data-parallel rank
        0); the distributed optimizer also gathers its sharded state over the data-parallel ranks into
        `parameter_file` (collective)."""
        if self.megatron_optimizer is None:
            return
        if write:
            torch.save(
                {'state_dict': self.megatron_optimizer.state_dict(), 'adam_step': self._adam_step()}, optimizer_file
            )
        if self.distributed:
            self.megatron_optimizer.save_parameter_state(str(parameter_file))

    @torch.no_grad()
    def load_shard(self, optimizer_file: Any, parameter_file: Any) -> None:
        """Restore what `save_shard` wrote (collective for the distributed optimizer)."""
        optimizer = self.require_optimizer()  # a resume sets the optimizer before loading its shards
        saved = torch.load(optimizer_file, map_location='cpu', weights_only=False)
        self.megatron_optimizer.load_state_dict(saved['state_dict'])
        if not self.distributed:
            return
        # Megatron's gathered parameter state has no per-parameter 'step', which torch's AdamW keeps (TE/Apex
        # FusedAdam keep it per group): set it aside while loading, then restore the saved count.
        states = [optimizer.state[p] for group in optimizer.param_groups for p in group['params']]
        steps = [state.pop('step', None) for state in states]
        self.megatron_optimizer.load_parameter_state(str(parameter_file))
        for state, step in zip(states, steps):
            if step is not None:
                state['step'] = torch.full_like(step, saved['adam_step']) if saved['adam_step'] is not None else step

    def _adam_step(self) -> float | None:
        """The (common) per-parameter step count of a torch Adam inner optimizer, None for other optimizers."""
        steps = {float(s['step']) for s in self.require_optimizer().state.values() if 'step' in s}
        return steps.pop() if len(steps) == 1 else None
