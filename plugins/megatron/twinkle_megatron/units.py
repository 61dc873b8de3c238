"""What one trainable unit of a `MegatronModel` owns: all parameters (``FULL``), or one named LoRA adapter.

Every unit runs the shared model chunks through Megatron DDP wrappers of its own, built over its own parameters
only, and steps its own Megatron optimizer (`MegatronTrainState`): adapters share the frozen base and nothing
else -- not gradient buffers, not optimizer state, not loss or processor. While a unit is used
(`TrainingUnit.scope`) its adapter is the active one and the other adapters' factors do not require gradients, so
Megatron's DDP, optimizer and `finalize_model_grads` (which all select ``requires_grad`` parameters) see this
unit alone.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

from twinkle_core.train.state import FULL
from twinkle_megatron import adapter_scope, lora
from twinkle_megatron.optim import MegatronTrainState


class TrainingUnit:
    """`name`: ``FULL`` or the adapter name; `modules`: the model's (unwrapped) chunks; `lora_config`: the
    adapter's `peft.LoraConfig` (None for ``FULL``). `chunks` are the DDP wrappers once `wrap` ran (before it,
    the modules)."""

    def __init__(
        self,
        name: str,
        modules: list[Any],
        *,
        lora_config: Any = None,
        distributed: bool,
        dtype: torch.dtype,
        gradient_accumulation_steps: int = 1,
    ) -> None:
        self.name, self.modules, self.lora_config = name, modules, lora_config
        self.adapter = None if name == FULL else name
        self.chunks: list[Any] = list(modules)
        self.wrapped = False
        self.state = MegatronTrainState(
            name,
            self.parameters,
            chunks=self.chunks,
            distributed=distributed,
            dtype=dtype,
            gradient_accumulation_steps=gradient_accumulation_steps,
            scope=self.scope,
            prepare=self.wrap,
        )
        self.last_loss: float | None = None  # of the last forward_backward, for calculate_loss

    def parameters(self) -> list[torch.nn.Parameter]:
        if self.adapter is None:
            return [p for m in self.modules for p in m.parameters()]
        return lora.adapter_parameters(self.modules, self.adapter)

    @contextmanager
    def scope(self) -> Iterator[None]:
        """Use this unit: its adapter active and alone trainable (see the module docstring)."""
        with adapter_scope.only_trainable(self.modules, self.adapter):
            yield

    def wrap(self) -> None:
        """Wrap the chunks in Megatron DDP over this unit's parameters (once; before its optimizer and first
        forward)."""
        if self.wrapped:
            return
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=self.state.distributed
        )
        with self.scope(), torch.enable_grad():  # DDP hooks grad accumulators, which exist only with autograd on
            self.chunks[:] = [
                DistributedDataParallel(config=m.config, ddp_config=ddp_config, module=m, disable_bucketing=i > 0)
                for i, m in enumerate(self.modules)
            ]
        self.wrapped = True
