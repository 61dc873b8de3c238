"""The named adapters of a `MegatronModel` (`AdapterMethods`, a mixin of the model): each a `TrainingUnit` of its
own (LoRA factors, optimizer, loss, processor) on the shared frozen base; without adapters the model trains all
parameters (the ``FULL`` unit)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.train.state import FULL
from twinkle_megatron import lora
from twinkle_megatron.architecture import Architecture, Layout
from twinkle_megatron.optim import MegatronTrainState
from twinkle_megatron.units import TrainingUnit

logger = logging.getLogger(__name__)


class AdapterMethods:
    """Adding, removing and addressing adapters; the model provides the attributes below."""

    chunks: list[Any]
    arch: Architecture
    layout: Layout
    ranks: dict[str, int]
    seed: int
    dtype: torch.dtype
    distributed_optimizer: bool
    units: dict[str, TrainingUnit]

    def _new_unit(self, name: str, lora_config: Any = None, gradient_accumulation_steps: int = 1) -> TrainingUnit:
        return TrainingUnit(
            name,
            self.chunks,
            lora_config=lora_config,
            distributed=self.distributed_optimizer,
            dtype=self.dtype,
            gradient_accumulation_steps=gradient_accumulation_steps,
        )

    def list_adapters(self) -> list[str]:
        return [name for name in self.units if name != FULL]

    def _name(self, adapter_name: str | None) -> str | None:
        """The adapter a call addresses: `adapter_name`, else the model's only adapter (None: full-parameter
        training)."""
        adapters = self.list_adapters()
        if adapter_name is None:
            if len(adapters) > 1:
                raise InvalidInputError(f'This model trains adapters {adapters}: name one with adapter_name=.')
            return adapters[0] if adapters else None
        if adapter_name not in adapters:
            trained = f'adapters {adapters}' if adapters else 'all parameters (no adapter)'
            raise InvalidInputError(f'Unknown adapter {adapter_name!r}: this model trains {trained}.')
        return adapter_name

    def unit_for(self, adapter_name: str | None) -> TrainingUnit:
        """The training unit (adapter or full parameters: weights, optimizer, loss) a call addresses."""
        return self.units[self._name(adapter_name) or FULL]

    def _state(self, adapter_name: str | None) -> MegatronTrainState:
        return self.unit_for(adapter_name).state

    # ---- configuration ---------------------------------------------------------------------------------------
    def add_adapter_to_model(
        self, adapter_name: str, config: Any, *, gradient_accumulation_steps: int = 1, **kwargs: Any
    ) -> None:
        """Add the tensor-parallel LoRA adapter `adapter_name` on the frozen base (`config`: a ``peft.LoraConfig``
        or a dict of its fields; ``target_modules`` defaults to ``'all-linear'``; ``seed``: initialisation seed,
        default the model's), with its own optimizer, loss and processor, set after this call. The first adapter
        ends full-parameter training (an optimizer set for it is dropped); more adapters can be added at any
        time."""
        lora.check_adapter_name(adapter_name)
        if adapter_name == FULL:
            raise InvalidInputError(f'{FULL!r} names full-parameter training here; pick another adapter name.')
        if adapter_name in self.units:
            raise InvalidInputError(f'Adapter {adapter_name!r} exists already; remove it first or pick another name.')
        seed = int(kwargs.pop('seed', self.seed))
        config = lora.lora_config(config, **kwargs)
        full = self.units.pop(FULL, None)
        if full is not None and full.state.optimizer is not None:
            logger.warning('add_adapter_to_model drops the optimizer set before it; call set_optimizer again.')
        lora.add_lora(
            self.chunks,
            self.arch,
            config,
            adapter=adapter_name,
            tp=self.layout.tp,
            tp_rank=self.ranks['tp'],
            sequence_parallel=self.layout.sp,
            seed=seed,
        )
        self.units[adapter_name] = self._new_unit(adapter_name, config, gradient_accumulation_steps)

    def remove_adapter(self, adapter_name: str) -> None:
        """Drop the adapter (its factors, optimizer and settings); without adapters left the model trains all
        parameters again."""
        if adapter_name not in self.list_adapters():
            raise InvalidInputError(f'Unknown adapter {adapter_name!r}; adapters: {self.list_adapters() or "none"}.')
        del self.units[adapter_name]
        if not lora.remove_lora(self.chunks, adapter_name):
            self.units[FULL] = self._new_unit(FULL)
