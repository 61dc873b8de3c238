"""Saving and loading `TransformersModel` checkpoints: the bodies of its `save` and `load` (which document the
formats), kept out of the model class. PEFT / HF files and the resumable training state are `checkpoint`'s;
gathering and resharding under a device mesh are `mesh_checkpoint`'s; sharded (DCP) checkpoints are
`sharded_checkpoint`'s.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.runtime.distributed import barrier
from twinkle_transformers import checkpoint as ckpt
from twinkle_transformers import mesh_checkpoint, parallel, sharded_checkpoint
from twinkle_transformers.checkpoint import CheckpointedModel


def save(
    model: CheckpointedModel,
    name: str,
    output_dir: str | None,
    save_optimizer: bool,
    adapter_name: str | None,
    dataloader: Any,
    extra_state: Any,
    sharded: bool = False,
) -> str:
    """`TransformersModel.save`: write checkpoint `name` under `output_dir`; returns its directory."""
    state = model.train_state(adapter_name)
    target = Path(output_dir or 'output') / name
    if sharded:
        sharded_checkpoint.save(
            model,
            target,
            save_optimizer=save_optimizer,
            adapter_name=adapter_name,
            dataloader=dataloader,
            extra_state=extra_state,
        )
        return str(target)
    optimizer_state = None
    if save_optimizer and state.optimizer is not None:  # by parameter name, gathered (collective under a mesh)
        optimizer_state = mesh_checkpoint.full_optimizer_state_dict(model.model, state.optimizer)
    write_here, gathered = mesh_checkpoint.gather_for_save(model.model)  # under a mesh: collective, rank 0 writes
    if not write_here:
        barrier()
        return str(target)
    with ckpt.atomic_directory(target) as tmp:
        if model.adapter_name is not None:
            ckpt.save_lora(model.model, model.adapter_name, tmp, base_model_id=model.model_id, state_dict=gathered)
        else:
            ckpt.save_full(model.model, model.tokenizer, tmp, state_dict=gathered, source_dir=model.model_dir)
        ckpt.write_metadata(
            tmp,
            kind='lora' if model.adapter_name else 'full',
            adapter_name=model.adapter_name,
            model_id=model.model_id,
            step=state.optimizer_steps,
            has_training_state=save_optimizer,
        )
        if save_optimizer:
            ckpt.save_training_state(
                tmp,
                {**state.state_dict(), 'optimizer': optimizer_state},
                dataloader=dataloader,
                extra_state=extra_state,
            )
    barrier()
    return str(target)


def load(model: CheckpointedModel, path: str, load_optimizer: bool, adapter_name: str | None, dataloader: Any) -> Any:
    """`TransformersModel.load`: load a checkpoint written by `save` (or a PEFT / HF directory)."""
    meta = ckpt.read_metadata(path)
    sharded = sharded_checkpoint.is_sharded_checkpoint(meta)
    if meta['kind'] == 'lora':
        if model.adapter_name is None:
            from peft import LoraConfig

            config = LoraConfig.from_pretrained(path)
            config.inference_mode = False  # PEFT saves adapters for inference; this model trains it
            model.add_adapter_to_model(adapter_name or meta.get('adapter_name') or 'default', config)
        assert model.adapter_name is not None  # set by add_adapter_to_model
        if sharded:
            _load_sharded_weights(model, path, meta, load_optimizer)
        elif parallel.is_sharded(model.model):
            from peft.utils import load_peft_weights

            mesh_checkpoint.load_adapter_weights_sharded(model.model, model.adapter_name, load_peft_weights(path))
        else:
            ckpt.load_lora_weights(model.model, model.adapter_name, path)
    else:
        if model.adapter_name is not None:
            raise InvalidInputError(
                f'{path!r} holds full model weights but this model trains adapter '
                f'{model.adapter_name!r}; load it into a model without adapter.'
            )
        if sharded:
            _load_sharded_weights(model, path, meta, load_optimizer)
        elif parallel.is_sharded(model.model):
            mesh_checkpoint.load_full_state_dict(model.model, ckpt.read_full_weights(path))
        else:
            ckpt.load_full_weights(model.model, path)
    if not load_optimizer:
        return None
    model.apply_device_mesh()  # the optimizer rebuilt below must see the final parameters
    saved = ckpt.load_training_state(path)
    if sharded:
        load_optimizer_state = partial(sharded_checkpoint.load_optimizer_state, model.model, path)
    else:
        load_optimizer_state = partial(mesh_checkpoint.load_optimizer_state, model.model)
    model.train_state(adapter_name).load_state_dict(  # resharded to this run's mesh (collective under one)
        saved['train_state'], load_optimizer_state=load_optimizer_state
    )
    return ckpt.restore_run_state(saved, dataloader)


def _load_sharded_weights(model: CheckpointedModel, path: str, meta: dict[str, Any], load_optimizer: bool) -> None:
    if load_optimizer:  # read straight into this run's shards (the optimizer is rebuilt over them next)
        model.apply_device_mesh()
    sharded_checkpoint.load_weights(model, path, meta)
