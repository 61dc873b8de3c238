"""Adapter checkpoints of `MultiLoraTransformersModel`: one adapter in PEFT format (loads with
``peft.PeftModel.from_pretrained``) plus, optionally, its training state (optimizer, scheduler, counters, a data
loader's state, caller `extra_state`), written atomically (`twinkle_transformers.checkpoint`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.train.state import TrainState
from twinkle_transformers import checkpoint as ckpt
from twinkle_transformers.multi_lora.manager import MultiLoraManager
from twinkle_transformers.multi_lora.peft_format import read_peft_adapter


def save_adapter(
    manager: MultiLoraManager,
    adapter: str,
    state: TrainState,
    target: Path,
    *,
    model_id: str,
    save_optimizer: bool,
    dataloader: Any,
    extra_state: Any,
) -> str:
    """Write `adapter` (and with `save_optimizer` its training state) as the checkpoint directory `target`."""
    with ckpt.atomic_directory(target) as tmp:
        manager.save_adapter(adapter, str(tmp), base_model_name_or_path=model_id)
        ckpt.write_metadata(
            tmp,
            kind='lora',
            adapter_name=adapter,
            model_id=model_id,
            step=state.optimizer_steps,
            has_training_state=save_optimizer,
        )
        if save_optimizer:
            ckpt.save_training_state(tmp, state.state_dict(), dataloader=dataloader, extra_state=extra_state)
    return str(target)


def read_adapter(path: str, load_optimizer: bool) -> tuple[Any, dict[str, Any], dict[str, Any] | None]:
    """(LoRA config, adapter weights, the saved training state when `load_optimizer`) of an adapter checkpoint
    written by `save_adapter` or any PEFT LoRA directory; full-weight checkpoints are refused."""
    if ckpt.read_metadata(path)['kind'] != 'lora':
        raise InvalidInputError(
            f'{path!r} holds full model weights; MultiLoraTransformersModel loads LoRA adapters only.'
        )
    config, weights = read_peft_adapter(path)
    training = ckpt.load_training_state(path)['train_state'] if load_optimizer else None
    return config, weights, training
