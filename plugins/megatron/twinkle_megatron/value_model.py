"""`MegatronValueModel`: a causal LM with a scalar head on Megatron-Core -- a PPO critic or a reward model as large
as the policy, split over tp / pp / dp like it.

`TransformersValueModel` -> `MegatronValueModel` is a one-word change, as for the policy: the same outputs
(``values`` per row aligned with ``input_ids``, ``scores`` after each row's last token), losses (`PPOValueLoss`,
`BradleyTerryLoss`), head initialisation and checkpoints. The vocabulary head is replaced by the scalar head
``score`` on the last pipeline stage (`twinkle_megatron.value_head`); a full checkpoint is a Hugging Face
``*ForSequenceClassification`` directory, a LoRA one a PEFT ``SEQ_CLS`` adapter with the head saved beside the
factors -- each loads in the other backend.

    critic = MegatronValueModel(policy_dir, device_mesh=DeviceMesh.from_sizes(tp_size=2, pp_size=2))
    critic.add_adapter_to_model('critic', {'r': 8})
    critic.set_optimizer('AdamW', lr=1e-4)
    out = critic.forward_backward(inputs=rows)  # rows carry 'returns' and 'old_values'; out['values'] per row
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.model.base import ModelCapabilities
from twinkle_core.train.value_head import (
    DEFAULT_VALUE_LOSS,
    HEAD,
    HEAD_WEIGHT,
    check_head_init,
    new_head_weight,
)
from twinkle_megatron import build, groups, lora
from twinkle_megatron.architecture import Architecture
from twinkle_megatron.model import MegatronModel


class MegatronValueModel(MegatronModel):
    """A value / reward model on Megatron-Core (kind ``model``, name ``MegatronValueModel``): `MegatronModel`'s
    arguments plus ``head_init`` (``'zero'``: the critic default, every state valued 0 at first; ``'normal'``:
    N(0, ``initializer_range``) drawn from ``head_seed``) for a checkpoint without a ``score`` head. Its default
    loss is `PPOValueLoss`; one LoRA adapter at most (the head is trained in full beside it). `forward_only` and
    `forward_backward` return ``values`` and ``scores`` per row instead of ``logprobs``."""

    capabilities = ModelCapabilities(
        takes_device=True,
        takes_device_mesh=True,
        mesh_dims=('dp', 'tp', 'pp'),
        mesh_advice=groups.MESH_ADVICE,
        gradient_checkpointing=True,
        outputs='values',
    )

    def __init__(
        self, model_id: str | os.PathLike[str], *, head_init: str = 'zero', head_seed: int = 0, **kwargs: Any
    ) -> None:
        self.head_init, self.head_seed = check_head_init(head_init), head_seed
        super().__init__(model_id, **kwargs)
        self.set_loss(DEFAULT_VALUE_LOSS)

    def _architecture(self, config: Any) -> Architecture:
        """The causal LM's architecture with the scalar head in place of the (possibly tied) vocabulary head."""
        self.initializer_range = float(getattr(config, 'initializer_range', 0.02))
        arch = super()._architecture(config)
        if arch.is_moe:
            raise InvalidInputError('MegatronValueModel takes dense checkpoints; use TransformersValueModel for MoE.')
        return dataclasses.replace(arch, value_head=True, tied_embeddings=False)

    def _weights_reader(self) -> Callable[[str], torch.Tensor]:
        """The checkpoint's tensors; a causal LM checkpoint (no ``score.weight``) gets a new head (`head_init`)."""
        read = build.HFTensorReader(self.model_dir)
        if HEAD_WEIGHT in read:
            return read
        new = new_head_weight(self.arch.hidden_size, self.head_init, seed=self.head_seed, std=self.initializer_range)
        return lambda name: new if name == HEAD_WEIGHT else read(name)

    def add_adapter_to_model(self, adapter_name: str, config: Any, **kwargs: Any) -> None:
        """A LoRA adapter on the decoder (PEFT ``SEQ_CLS``); the head trains in full and is saved with it. One
        adapter at most: a second would share the head."""
        if self.list_adapters():
            raise InvalidInputError(
                f'MegatronValueModel trains one adapter (it has {self.list_adapters()}): the value head is trained '
                'in full beside it, so a second adapter would share it. Use another model for another critic.'
            )
        fields = dict(config.to_dict() if hasattr(config, 'to_dict') else config or {})
        if lora.OUTPUT in lora.target_projections(fields.get('target_modules')):
            raise InvalidInputError(f'A value model has no {lora.OUTPUT} to adapt; its {HEAD!r} head trains in full.')
        fields.update(task_type='SEQ_CLS', modules_to_save=[HEAD])
        super().add_adapter_to_model(adapter_name, fields, **kwargs)
        self.set_loss(DEFAULT_VALUE_LOSS, adapter_name=adapter_name)
