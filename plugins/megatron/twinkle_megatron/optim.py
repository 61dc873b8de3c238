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

from typing import Any, Callable, Iterable

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.model.train_state import TrainState, _spec_name
from twinkle_megatron.cpu_compat import tensors_as_cuda

_ADAM = {'adamw': 'adam', 'adam': 'adam', 'sgd': 'sgd'}


def optimizer_config(name: Any, kwargs: dict[str, Any], *, distributed: bool, dtype: torch.dtype) -> Any:
    """`megatron.core.optimizer.OptimizerConfig` for a twinkle optimizer name and its torch-style kwargs."""
    from megatron.core.optimizer import OptimizerConfig
    key = name.lower() if isinstance(name, str) else getattr(name, '__name__', '').lower()
    if key not in _ADAM:
        raise InvalidInputError(f'MegatronModel builds Megatron optimizers: AdamW, Adam or SGD; got {name!r}. '
                                f'(Other torch optimizers cannot drive Megatron\'s sharded grad buffers.)')
    args = dict(kwargs)
    unknown = sorted(set(args) - {'lr', 'weight_decay', 'betas', 'eps', 'momentum'})
    if unknown:
        raise InvalidInputError(f'set_optimizer({name!r}): MegatronModel does not take {unknown}; it takes lr, '
                                f'weight_decay, betas, eps (Adam) and momentum (SGD).')
    if key == 'adam' and args.get('weight_decay', 0.0):
        raise InvalidInputError('set_optimizer("Adam", weight_decay=...): Megatron\'s Adam decays weights '
                                'decoupled (AdamW); ask for "AdamW" instead.')
    betas = args.pop('betas', (0.9, 0.999))
    fp16 = dtype in (torch.bfloat16, torch.float16)
    return OptimizerConfig(
        optimizer=_ADAM[key], lr=float(args.get('lr', 1e-3)),
        weight_decay=float(args.get('weight_decay', 0.01 if key == 'adamw' else 0.0)),
        adam_beta1=float(betas[0]), adam_beta2=float(betas[1]), adam_eps=float(args.get('eps', 1e-8)),
        sgd_momentum=float(args.get('momentum', 0.0)), use_distributed_optimizer=distributed,
        clip_grad=0.0, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        params_dtype=dtype if fp16 else torch.float32)


class MegatronTrainState(TrainState):
    """A `TrainState` whose optimizer is a Megatron optimizer over DDP-wrapped model `chunks`.

    ``self.optimizer`` is the inner torch optimizer (what LR schedulers, `update_optimizer` and the metrics
    read); ``self.megatron_optimizer`` steps it. `distributed`: use the distributed optimizer."""

    def __init__(self, name: str, parameters: Callable[[], Iterable[torch.nn.Parameter]], *, chunks: list[Any],
                 distributed: bool, dtype: torch.dtype, gradient_accumulation_steps: int = 1) -> None:
        super().__init__(name, parameters, gradient_accumulation_steps=gradient_accumulation_steps)
        self.chunks = chunks
        self.distributed = distributed
        self.dtype = dtype
        self.megatron_optimizer: Any = None
        self._grads_ready = False

    def set_optimizer(self, optimizer: Any, **kwargs: Any) -> None:
        from megatron.core.optimizer import get_megatron_optimizer
        config = optimizer_config(optimizer, kwargs, distributed=self.distributed, dtype=self.dtype)
        with tensors_as_cuda():
            self.megatron_optimizer = get_megatron_optimizer(config, self.chunks)
        self.optimizer = self.megatron_optimizer.optimizer
        self.lr_scheduler = None
        self.specs.pop('lr_scheduler', None)
        self.specs['optimizer'] = {'name': _spec_name(optimizer), 'kwargs': kwargs}

    def _finalize(self) -> None:
        """Reduce the accumulated grads (once per step) and hand them to the optimizer."""
        if not self._grads_ready:
            from megatron.core.distributed import finalize_model_grads
            finalize_model_grads(self.chunks)
            with tensors_as_cuda():
                self.megatron_optimizer.prepare_grads()
            self._grads_ready = True

    def clip_grad_norm(self, max_norm: float | None = 1.0) -> float:
        if self.megatron_optimizer is None:
            self.require_optimizer()
        self._finalize()
        with tensors_as_cuda():
            if max_norm is None:
                norm = float(self.megatron_optimizer.get_grad_norm())
            else:
                norm = float(self.megatron_optimizer.clip_grad_norm(float(max_norm)))
        self.last_grad_norm = norm
        return norm

    def step(self) -> None:
        self.require_optimizer()
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

    def shard_state(self) -> dict[str, Any] | None:
        """This rank's optimizer state (Megatron's `state_dict`; the distributed optimizer adds its parameter
        state gathered over the data-parallel ranks -- collective)."""
        if self.megatron_optimizer is None:
            return None
        state = {'optimizer': self.megatron_optimizer.state_dict()}
        if self.distributed:
            state['parameter_state'] = self.megatron_optimizer.get_parameter_state_dp_zero()
        return state

    def load_shard_state(self, state: dict[str, Any]) -> None:
        self.megatron_optimizer.load_state_dict(state['optimizer'])
        if self.distributed:
            self.megatron_optimizer.load_parameter_state_from_dp_zero(state['parameter_state'])
