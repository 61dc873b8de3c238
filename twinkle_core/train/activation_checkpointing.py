"""Activation checkpointing: recompute chosen blocks' activations in backward instead of keeping them, the option
backends expose as ``gradient_checkpointing``.

Accepted values (`checkpoint_policy`):

- ``False`` / ``None``: off (the default);
- ``True`` or ``'full'``: every decoder layer;
- an integer ``k`` or ``{'every': k}``: every k-th layer (layers 0, k, 2k, ...): memory between none and all;
- ``'selective'`` (or ``{'selective': True, ...}``): only the attention block of each chosen layer (the
  attention's inputs are kept, its intermediate activations recomputed), cheaper to recompute than a whole layer;
- ``{'layers': [0, 1, 5]}``: those layer indices; or a `CheckpointPolicy`.

A checkpointed block runs its forward under ``torch.utils.checkpoint`` (``use_reentrant=False``, RNG state
preserved) whenever gradients are enabled, so gradients equal those of the plain run; without gradients
(evaluation, reference log-probs) it runs as usual. Recomputation runs the block's forward again during backward:
state a forward reads besides its arguments (e.g. the multi-LoRA router) must still be set then.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Mapping, Sequence

from twinkle_core.errors import InvalidInputError

if TYPE_CHECKING:
    from torch import nn

#: where a decoder layer keeps its attention block (Hugging Face, Megatron, others)
ATTENTION_NAMES = ('self_attn', 'self_attention', 'attention', 'attn')
_ORIGINAL = '_twinkle_unchecked_forward'

__all__ = ['CheckpointPolicy', 'apply_activation_checkpointing', 'checkpoint_module', 'checkpoint_policy']


@dataclass(frozen=True)
class CheckpointPolicy:
    """Which blocks recompute: every `every`-th decoder layer, or exactly `layers`; with `selective`, only the
    attention block of each of them."""

    every: int = 1
    layers: tuple[int, ...] | None = None
    selective: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise InvalidInputError(f'gradient_checkpointing: every must be an integer >= 1, got {self.every!r}.')
        if self.layers is not None:
            object.__setattr__(self, 'layers', tuple(self.layers))
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.layers or ()):
                raise InvalidInputError(f'gradient_checkpointing: layers must be indices >= 0, got {self.layers!r}.')

    def chosen(self, num_layers: int) -> list[int]:
        """The indices of the layers to checkpoint in a model of `num_layers` layers."""
        if self.layers is not None:
            outside = [i for i in self.layers if i >= num_layers]
            if outside:
                raise InvalidInputError(
                    f'gradient_checkpointing: layers {outside} do not exist (the model has {num_layers} layers).'
                )
            return sorted(set(self.layers))
        return list(range(0, num_layers, self.every))


def checkpoint_policy(value: Any) -> CheckpointPolicy | None:
    """The policy `value` asks for (module docstring), None for off; InvalidInputError for anything else."""
    if value is None or value is False:
        return None
    if isinstance(value, CheckpointPolicy):
        return value
    if value is True or value == 'full':
        return CheckpointPolicy()
    if value == 'selective':
        return CheckpointPolicy(selective=True)
    if isinstance(value, int) and not isinstance(value, bool):
        return CheckpointPolicy(every=value)
    if isinstance(value, Mapping):
        unknown = set(value) - {'every', 'layers', 'selective'}
        if unknown:
            raise InvalidInputError(
                f'gradient_checkpointing: unknown keys {sorted(unknown)}; a policy takes every, layers, selective.'
            )
        return CheckpointPolicy(**value)
    raise InvalidInputError(
        f"gradient_checkpointing must be True, False, 'full', 'selective', an integer k (every k-th layer), "
        f"{{'every': k}}, {{'layers': [...]}} or a CheckpointPolicy; got {value!r}."
    )


def attention_of(layer: nn.Module) -> nn.Module:
    """The attention block of a decoder layer (`ATTENTION_NAMES`); InvalidInputError when it has none."""
    from torch import nn

    for name in ATTENTION_NAMES:
        block = getattr(layer, name, None)
        if isinstance(block, nn.Module):
            return block
    raise InvalidInputError(
        f"gradient_checkpointing='selective': {type(layer).__name__} has no attention block "
        f'({", ".join(ATTENTION_NAMES)}); checkpoint whole layers instead.'
    )


#: called at each checkpointed forward with the checkpointed module; the context manager it returns is entered
#: around that forward's recomputation (to set again what the forward read besides its arguments)
RecomputeContext = Callable[['nn.Module'], ContextManager[Any]]


def checkpoint_module(module: nn.Module, recompute_context: RecomputeContext | None = None) -> None:
    """Make `module`'s forward recompute in backward (in place; calling it again changes nothing)."""
    if _ORIGINAL in module.__dict__:
        return
    import torch
    from torch.utils.checkpoint import checkpoint

    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        if recompute_context is None:
            return checkpoint(original, *args, use_reentrant=False, **kwargs)
        restore = recompute_context(module)  # what this forward reads, captured now
        return checkpoint(original, *args, use_reentrant=False, context_fn=lambda: (nullcontext(), restore), **kwargs)

    module.__dict__[_ORIGINAL] = original
    module.forward = forward


def apply_activation_checkpointing(
    layers: Sequence[nn.Module],
    gradient_checkpointing: Any,
    *,
    indices: Sequence[int] | None = None,
    num_layers: int | None = None,
    recompute_context: RecomputeContext | None = None,
) -> list[int]:
    """Checkpoint the decoder `layers` (or their attention blocks) that `gradient_checkpointing` chooses, in
    place; returns the chosen layer indices (empty when off). `indices` / `num_layers`: where the given layers
    are in the whole model (a pipeline stage holds some of them); default: all of its layers, in order.
    `recompute_context`: see `RecomputeContext` (e.g. which LoRA adapter each forward used)."""
    policy = checkpoint_policy(gradient_checkpointing)
    if policy is None:
        return []
    indices = list(range(len(layers))) if indices is None else list(indices)
    chosen = set(policy.chosen(len(layers) if num_layers is None else num_layers))
    picked = []
    for index, layer in zip(indices, layers):
        if index in chosen:
            checkpoint_module(attention_of(layer) if policy.selective else layer, recompute_context)
            picked.append(index)
    return picked
