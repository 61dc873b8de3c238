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
"""
from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from twinkle_core.errors import InvalidInputError

METADATA_FILE = 'twinkle_checkpoint.json'
TRAINING_STATE_FILE = 'training_state.pt'
FORMAT_VERSION = 1


@contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory that replaces `path` only when the block succeeds (an old checkpoint at
    `path` stays intact until then)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f'.{final.name}.tmp-{uuid.uuid4().hex[:8]}')
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = final.with_name(f'.{final.name}.old-{uuid.uuid4().hex[:8]}')
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def write_metadata(directory: Path, **fields: Any) -> None:
    (directory / METADATA_FILE).write_text(json.dumps({'format_version': FORMAT_VERSION, **fields}, indent=2))


def read_metadata(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint's metadata; for directories written by other tools, inferred from their files."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InvalidInputError(f'Checkpoint directory {str(directory)!r} does not exist.')
    meta_file = directory / METADATA_FILE
    if meta_file.exists():
        return json.loads(meta_file.read_text())
    if (directory / 'adapter_config.json').exists():
        return {'kind': 'lora', 'adapter_name': None}
    if (directory / 'config.json').exists():
        return {'kind': 'full'}
    raise InvalidInputError(f'{str(directory)!r} is not a checkpoint: it has neither {METADATA_FILE}, '
                            f'adapter_config.json (PEFT) nor config.json (Hugging Face).')


# ---- LoRA --------------------------------------------------------------------------------------------------
def save_lora(model: Any, adapter_name: str, directory: Path, *, base_model_id: str,
              state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """Write one adapter of a PEFT model in PEFT format at the top of `directory` (whatever its name).
    `state_dict`: the model's full state dict when the live one is sharded (gathered by the caller)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    config = model.peft_config[adapter_name]
    # The base embeddings never change under LoRA (a LoRA on a tied lm_head only adds its own delta): not saved.
    state = get_peft_model_state_dict(model, state_dict=state_dict, adapter_name=adapter_name,
                                      save_embedding_layers=False)
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()},
              str(directory / 'adapter_model.safetensors'), metadata={'format': 'pt'})
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
        raise InvalidInputError(f'Adapter checkpoint {str(directory)!r} does not match adapter {adapter_name!r}: '
                                f'{len(unexpected)} unexpected tensors, e.g. {unexpected[:3]}. Was it saved with '
                                f'another LoRA config or base model?')


# ---- full weights ------------------------------------------------------------------------------------------
def save_full(model: Any, tokenizer: Any, directory: Path, *, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    model.save_pretrained(str(directory), safe_serialization=True, state_dict=state_dict)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))


def load_full_weights(model: torch.nn.Module, directory: str | os.PathLike[str]) -> None:
    """Copy Hugging Face safetensors weights into `model` in place (the optimizer keeps its parameters)."""
    result = model.load_state_dict(read_full_weights(directory), strict=False)
    tied = set(getattr(model, 'all_tied_weights_keys', None) or {}) | _tied_parameter_names(model)
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise InvalidInputError(f'Weights in {str(directory)!r} do not match the model: missing {missing[:3]} '
                                f'({len(missing)}), unexpected {result.unexpected_keys[:3]} '
                                f'({len(result.unexpected_keys)}).')


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


# ---- training state ----------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Every global RNG state, as plain python values and tensors (loadable with ``weights_only=True``)."""
    import numpy as np
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {'python': random.getstate(), 'numpy': (name, keys.tolist(), pos, has_gauss, gauss),
             'torch': torch.get_rng_state()}
    if torch.cuda.is_available():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    random.setstate(state['python'])
    name, keys, pos, has_gauss, gauss = state['numpy']
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


def save_training_state(directory: Path, train_state: dict[str, Any], *, dataloader: Any = None,
                        extra_state: Any = None) -> None:
    payload = {'train_state': train_state, 'rng': rng_state(), 'extra_state': extra_state,
               'dataloader': dataloader.state_dict() if dataloader is not None else None}
    torch.save(payload, directory / TRAINING_STATE_FILE)


def load_training_state(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(directory) / TRAINING_STATE_FILE
    if not path.exists():
        raise InvalidInputError(f'{str(directory)!r} has no {TRAINING_STATE_FILE}; it was saved without '
                                f'save_optimizer=True, so only its weights can be loaded (load_optimizer=False).')
    return torch.load(path, map_location='cpu', weights_only=True)
