"""Which adapters of a `MegatronModel` a forward uses and which train (`twinkle_megatron.lora` holds the factors).

Every LoRA linear adds the update of its `active` adapter. A call of one adapter makes it active and alone
trainable for the whole call (`only_trainable`): Megatron DDP, optimizers and `finalize_model_grads`, which all
select ``requires_grad`` parameters, then see that adapter alone. A mixed call (`twinkle_megatron.mixed_step`)
makes its tenants' adapters trainable together (`trainable`) and activates each micro-batch's adapter before its
forward (`activate`); a checkpointed layer recomputes with the adapter its forward used (`recompute_routing`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Collection, ContextManager, Iterator

from torch import nn

from twinkle_megatron.lora import LoraParallelLinear, lora_modules


def activate(chunks: list[Any], adapter: str | None) -> None:
    """Make `adapter` the one every LoRA linear of `chunks` adds (None: the base model alone)."""
    for module in lora_modules(chunks).values():
        module.active = adapter


@contextmanager
def trainable(chunks: list[Any], adapters: Collection[str]) -> Iterator[None]:
    """Within the block only the factors of `adapters` require gradients (of all adapters); they all do again
    after it."""
    others = [
        p
        for module in lora_modules(chunks).values()
        for name, factors in module.adapters.items()
        if name not in adapters
        for p in factors.parameters()
    ]
    for p in others:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in others:
            p.requires_grad_(True)


@contextmanager
def only_trainable(chunks: list[Any], adapter: str | None) -> Iterator[None]:
    """Within the block `adapter` is the active adapter and the only trainable one (None: the base model alone,
    no adapter trainable)."""
    activate(chunks, adapter)
    with trainable(chunks, () if adapter is None else (adapter,)):
        yield


def recompute_routing(module: nn.Module) -> ContextManager[None]:
    """For activation checkpointing (`twinkle_core.train.activation_checkpointing.RecomputeContext`): the active
    adapter of each LoRA linear in `module` now, set again while its forward is recomputed (by then another
    micro-batch of a mixed call may have activated another adapter)."""
    active = [(m, m.active) for m in module.modules() if isinstance(m, LoraParallelLinear)]

    @contextmanager
    def restored() -> Iterator[None]:
        current = [(m, m.active) for m, _ in active]
        for m, name in active:
            m.active = name
        try:
            yield
        finally:
            for m, name in current:
                m.active = name

    return restored()
