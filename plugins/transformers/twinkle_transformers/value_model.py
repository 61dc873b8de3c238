"""`TransformersValueModel`: a causal LM with a scalar head -- a PPO critic or a reward model.

The checkpoint loads as ``AutoModelForSequenceClassification`` with one label: the decoder of any causal LM
checkpoint plus a linear ``score`` head (new, or trained: Hugging Face reward models load as they are). The head
is applied at every position, not only the last one: position ``t``'s value estimates what follows the tokens
``0..t``. Outputs, as the rest of the twinkle `Model` interface gives them per row:

- ``values``: per row, aligned with its ``input_ids`` like ``logprobs`` -- element ``i`` is the value of the state
  *before* token ``i`` (element 0 is 0.0), so a completion's values are ``values[prompt_len:]``;
- ``scores``: per row, the head's output after its last token -- a reward model's score of the whole row.

Losses read ``outputs['values']`` [B, T] (the head at each position, aligned with the collated labels):
`PPOValueLoss` (critic) and `BradleyTerryLoss` (reward model). LoRA trains the head fully (PEFT's
``modules_to_save``) and saves it with the adapter.

    critic = TransformersValueModel(model_id=policy_dir)
    critic.add_adapter_to_model('critic', {'r': 8})
    critic.set_loss('PPOValueLoss', clip_range=0.2)
    critic.set_optimizer('AdamW', lr=1e-4)
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.model.base import ModelCapabilities
from twinkle_core.train.model_loading import load_tokenizer_if_any
from twinkle_core.train.value_head import (
    DEFAULT_VALUE_LOSS,
    HEAD,
    check_head_init,
    check_value_loss,
    new_head_weight,
    value_row_outputs,
)
from twinkle_core.types import IGNORE_INDEX
from twinkle_transformers.forward import model_call_kwargs
from twinkle_transformers.loading import config_kwargs, resolve_attention
from twinkle_transformers.model import TransformersModel


def load_value_model(
    model_dir: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str | None,
    head_init: str = 'zero',
    head_seed: int = 0,
    **kwargs: Any,
) -> torch.nn.Module:
    """`model_dir` as ``AutoModelForSequenceClassification`` with ``num_labels=1`` on `device` in `dtype`. A causal
    LM checkpoint gets a new ``score`` head (transformers reports it missing), initialised as `head_init` says
    (``'zero'`` | ``'normal'`` with `head_seed` and the config's ``initializer_range``: `new_head_weight`).
    ``pad_token_id`` is set from the tokenizer when the config has none (the head's own pooling needs one)."""
    check_head_init(head_init)
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.from_pretrained(model_dir, **config_kwargs(kwargs))
    attn_implementation = resolve_attention(config, attn_implementation)
    if attn_implementation is not None:
        kwargs['attn_implementation'] = attn_implementation
    kwargs.setdefault('num_labels', 1)
    model, info = AutoModelForSequenceClassification.from_pretrained(
        model_dir, dtype=dtype, output_loading_info=True, **kwargs
    )
    if any(key.split('.')[0] == HEAD for key in info['missing_keys']):  # a new head
        std = float(getattr(model.config, 'initializer_range', 0.02))
        weight = new_head_weight(model.score.weight.shape[1], head_init, seed=head_seed, std=std)
        with torch.no_grad():
            model.score.weight.copy_(weight)
    if model.config.num_labels != 1:
        raise InvalidInputError(
            f'{model_dir} has a {model.config.num_labels}-label head; a value / reward model has one output.'
        )
    model.config.use_cache = False
    if model.config.pad_token_id is None:
        tokenizer = load_tokenizer_if_any(model_dir)
        pad = getattr(tokenizer, 'pad_token_id', None)
        model.config.pad_token_id = pad if pad is not None else getattr(tokenizer, 'eos_token_id', 0)
    return model.to(device)


def scalar_head(model: torch.nn.Module) -> torch.nn.Module:
    """The ``score`` head of a (PEFT-wrapped) sequence-classification model."""
    wrapper: Any = model
    inner: Any = wrapper.get_base_model() if hasattr(wrapper, 'get_base_model') else wrapper
    head = getattr(inner, HEAD, None)
    if head is None:
        raise InvalidInputError(f'{type(inner).__name__} has no {HEAD!r} head; load it with TransformersValueModel.')
    return head


def forward_values(model: torch.nn.Module, batch: dict[str, Any], *, loss: object = None) -> dict[str, Any]:
    """Run the value model on a collated batch: ``values`` [B, T] float32 (the head at every position),
    ``mask`` (labels != -100) and ``correct`` (all False: there is no token prediction). A `loss` that does not
    declare ``needs_values`` is refused. The whole model runs (data-parallel wrappers' hooks fire); the head's
    per-position output is read by a forward hook before transformers pools it to the last token."""
    check_value_loss(loss)
    captured: list[torch.Tensor] = []
    handle = scalar_head(model).register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        model(**model_call_kwargs(batch, model))
    finally:
        handle.remove()
    values = captured[-1].squeeze(-1).float()
    mask = batch['labels'] != IGNORE_INDEX
    return {'values': values, 'mask': mask, 'correct': torch.zeros_like(mask)}


class TransformersValueModel(TransformersModel):
    """A value / reward model (kind ``model``, name ``TransformersValueModel``): `TransformersModel` with a scalar
    head; same arguments, same training interface, plus ``head_init`` (``'zero'`` | ``'normal'``) and
    ``head_seed``: how a new head starts (`load_value_model`). Its default loss is `PPOValueLoss`; `forward_only`
    and `forward_backward` return ``values`` and ``scores`` per row instead of ``logprobs``. Trains in one process
    or data-parallel (a ``dp`` device mesh: torchrun, a Ray group with ``remote_group=``)."""

    capabilities = ModelCapabilities(
        takes_device=True, takes_device_mesh=True, mesh_dims=('dp',), gradient_checkpointing=True, outputs='values'
    )
    _load_model, _forward_outputs = staticmethod(load_value_model), staticmethod(forward_values)

    def __init__(self, model_id: Any, **kwargs: Any) -> None:
        super().__init__(model_id, **kwargs)
        self.state.set_loss(DEFAULT_VALUE_LOSS)

    def add_adapter_to_model(self, adapter_name: str, config: Any, **kwargs: Any) -> None:
        """A LoRA adapter on the decoder; the ``score`` head trains in full and is saved with the adapter."""
        super().add_adapter_to_model(adapter_name, config, task_type='SEQ_CLS', **kwargs)
        self.state.set_loss(DEFAULT_VALUE_LOSS)

    def _row_outputs(self, batch: dict[str, Any], outputs: dict[str, Any]) -> dict[str, list[Any]]:
        return value_row_outputs(batch, outputs['values'])
