"""Checkpoint files of a Transformers-backed model.

A checkpoint is one directory, written atomically (into a temporary sibling, then renamed):

- LoRA: ``adapter_config.json`` + ``adapter_model.safetensors`` -- PEFT format, loadable with
  ``peft.PeftModel.from_pretrained(base, path)``;
- full weights: Hugging Face format (``config.json``, ``model*.safetensors``, tokenizer files);
- ``twinkle_checkpoint.json``: what was saved (kind, adapter name, model id, optimizer step);
- ``training_state.pt`` (``save_optimizer=True``): the `TrainState` (optimizer, LR scheduler, counters; the
  optimizer state of `TransformersModel` is keyed by parameter name, so any world size can resume it), the RNG
  states (torch CPU/CUDA, python, numpy), an optional data-loader state and optional caller ``extra_state`` --
  everything needed to resume bit-for-bit. It is read with ``torch.load(weights_only=True)``: plain python
  values and tensors only (data-loader states and ``extra_state`` must be made of those).

The directory, metadata and training-state files are backend-neutral (`twinkle_core.train.checkpoint_dir`);
this module adds the Hugging Face / PEFT weight files.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from twinkle_core.errors import InvalidInputError

if TYPE_CHECKING:
    from twinkle_core.train.state import TrainState

# the backend-neutral half (atomic directories, metadata, training state), used through this module as `ckpt.*`
from twinkle_core.train.checkpoint_dir import (  # noqa: F401
    METADATA_FILE,
    TRAINING_STATE_FILE,
    atomic_directory,
    load_training_state,
    read_metadata,
    restore_run_state,
    rng_state,
    save_training_state,
    write_metadata,
)


class CheckpointedModel(Protocol):
    """What saving and loading a checkpoint use of a Transformers-backed model (`TransformersModel`): its torch
    module, where it came from, its adapter, and two public operations."""

    model: Any  # the torch module (a PeftModel once an adapter is added)
    model_id: str
    model_dir: str
    tokenizer: Any

    @property
    def adapter_name(self) -> str | None:
        """The trained adapter, None for full-parameter training."""
        ...

    def train_state(self, adapter_name: str | None) -> TrainState:
        """The optimizer, scheduler and counters a checkpoint saves and restores."""
        ...

    def apply_device_mesh(self) -> None:
        """Parallelise over the device mesh now (idempotent): before an optimizer is rebuilt over the parameters."""
        ...

    def add_adapter_to_model(self, adapter_name: str, config: Any, **kwargs: Any) -> None:
        """Add and train a LoRA adapter (a checkpoint of an adapter loaded into a model without one)."""
        ...


# ---- LoRA --------------------------------------------------------------------------------------------------
def save_lora(
    model: Any,
    adapter_name: str,
    directory: Path,
    *,
    base_model_id: str,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write one adapter of a PEFT model in PEFT format at the top of `directory` (whatever its name).
    `state_dict`: the model's full state dict when the live one is sharded (gathered by the caller)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    config = model.peft_config[adapter_name]
    # The base embeddings never change under LoRA (a LoRA on a tied lm_head only adds its own delta): not saved.
    state = get_peft_model_state_dict(
        model, state_dict=state_dict, adapter_name=adapter_name, save_embedding_layers=False
    )
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in state.items()},
        str(directory / 'adapter_model.safetensors'),
        metadata={'format': 'pt'},
    )
    save_lora_config(config, directory, base_model_id=base_model_id)


def save_lora_config(config: Any, directory: Path, *, base_model_id: str) -> None:
    """Write ``adapter_config.json`` of `config` (a ``LoraConfig``) naming `base_model_id` as its base model."""
    previous = config.base_model_name_or_path
    config.base_model_name_or_path = base_model_id
    try:
        config.save_pretrained(str(directory))
    finally:
        config.base_model_name_or_path = previous


def load_lora_weights(model: Any, adapter_name: str, directory: str | os.PathLike[str]) -> None:
    """Load PEFT adapter weights into the existing adapter `adapter_name`; every saved tensor must fit."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    weights = load_peft_weights(str(directory), device=str(next(model.parameters()).device))
    result = set_peft_model_state_dict(model, weights, adapter_name=adapter_name)
    unexpected = list(getattr(result, 'unexpected_keys', []) or [])
    if unexpected:
        raise InvalidInputError(
            f'Adapter checkpoint {str(directory)!r} does not match adapter {adapter_name!r}: '
            f'{len(unexpected)} unexpected tensors, e.g. {unexpected[:3]}. Was it saved with '
            f'another LoRA config or base model?'
        )


# ---- full weights ------------------------------------------------------------------------------------------
#: Files of a model directory that describe its input processing (image processors, processor configs): a full
#: checkpoint carries them over so that it loads like the original model.
PROCESSOR_FILES = ('preprocessor_config.json', 'processor_config.json', 'video_preprocessor_config.json')


def save_full(
    model: Any,
    tokenizer: Any,
    directory: Path,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
    source_dir: str | os.PathLike[str] | None = None,
) -> None:
    """HF-format weights + config, the tokenizer, and `source_dir`'s processor files (`PROCESSOR_FILES`)."""
    model.save_pretrained(str(directory), safe_serialization=True, state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    copy_processor_files(source_dir, directory)


def copy_processor_files(source_dir: str | os.PathLike[str] | None, directory: Path) -> None:
    """Copy `source_dir`'s `PROCESSOR_FILES` (those it has) into `directory`, keeping files already there."""
    if source_dir is not None and Path(source_dir).is_dir():
        for name in PROCESSOR_FILES:
            if (Path(source_dir) / name).is_file() and not (directory / name).exists():
                shutil.copyfile(Path(source_dir) / name, directory / name)


def load_full_weights(model: torch.nn.Module, directory: str | os.PathLike[str]) -> None:
    """Copy Hugging Face safetensors weights into `model` in place (the optimizer keeps its parameters)."""
    result = model.load_state_dict(read_full_weights(directory), strict=False)
    tied = set(getattr(model, 'all_tied_weights_keys', None) or {}) | _tied_parameter_names(model)
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise InvalidInputError(
            f'Weights in {str(directory)!r} do not match the model: missing {missing[:3]} '
            f'({len(missing)}), unexpected {result.unexpected_keys[:3]} '
            f'({len(result.unexpected_keys)}).'
        )


def read_full_weights(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of the Hugging Face safetensors files in `directory` (CPU)."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob('*.safetensors'))
    if not files:
        raise InvalidInputError(f'No *.safetensors weights in {str(directory)!r}.')
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def _tied_parameter_names(model: torch.nn.Module) -> set[str]:
    """Names under which an already-listed parameter appears again (tied embeddings)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        seen.setdefault(id(p), name)
    return tied
