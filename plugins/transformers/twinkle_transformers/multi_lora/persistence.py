"""Adapter checkpoints of `MultiLoraTransformersModel`: one adapter in PEFT format (loads with
``peft.PeftModel.from_pretrained``) plus, optionally, its training state (optimizer, scheduler, counters, a data
loader's state, caller `extra_state`), written atomically (`twinkle_transformers.checkpoint`). The model's
`save` / `load` are `AdapterCheckpointMethods`; on several data ranks (which hold the same adapter) rank 0 writes
and every rank reads, so a checkpoint is the same directory at any world size and loads at any other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.train.state import TrainState
from twinkle_core.train.state_methods import reports_failure
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


class AdapterCheckpointMethods:
    """`save` / `load` of `MultiLoraTransformersModel` (mixed in before `Model`; uses its ``manager``, ``states``,
    ``model_id``, ``data_ranks``, ``_name``, ``_state`` and ``_add``)."""

    @reports_failure('save')
    def save(
        self: Any,
        name: str,
        *,
        output_dir: str | None = None,
        save_optimizer: bool = False,
        adapter_name: str | None = None,
        dataloader: Any = None,
        extra_state: Any = None,
        **kwargs: Any,
    ) -> str:
        """Write adapter checkpoint `name` under `output_dir` (default ``./output``) atomically; returns its
        directory. PEFT format (loads with ``peft.PeftModel.from_pretrained``) plus, with `save_optimizer`,
        the adapter's optimizer, scheduler, counters, ``dataloader.state_dict()`` and `extra_state`."""
        adapter = self._name(adapter_name)
        target = Path(output_dir or 'output') / name
        if self.data_ranks is None or self.data_ranks.rank == 0:
            save_adapter(
                self.manager,
                adapter,
                self._state(adapter),
                target,
                model_id=self.model_id,
                save_optimizer=save_optimizer,
                dataloader=dataloader,
                extra_state=extra_state,
            )
        if self.data_ranks is not None:
            self.data_ranks.barrier()  # the directory exists for every rank once save returns
        return str(target)

    @reports_failure('load')
    def load(
        self: Any,
        path: str,
        *,
        load_optimizer: bool = False,
        adapter_name: str | None = None,
        gradient_accumulation_steps: int = 1,
        **kwargs: Any,
    ) -> None:
        """Load an adapter checkpoint written by `save` (or any PEFT LoRA directory) into `adapter_name`.

        A name that does not exist yet is created from the checkpoint's config: a fresh engine resumes under any
        name. An existing adapter must have the same targets and ranks (else nothing changes and this raises).
        `load_optimizer` restores the optimizer, scheduler and counters (the optimizer is rebuilt from its saved
        registry name when not set). Global RNG states are NOT restored: they are shared by every tenant.
        """
        name = self._name(adapter_name)
        config, weights, training = read_adapter(path, load_optimizer)
        if name not in self.states:
            self._add(name, config, gradient_accumulation_steps, state_dict=weights)
        else:
            self.manager.load_state_dict(name, weights)
        if training is not None:
            self.states[name].load_state_dict(training)
