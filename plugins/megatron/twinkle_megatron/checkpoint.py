"""`MegatronModel` checkpoints: the same directory as `TransformersModel`'s, whatever the layout.

- full weights: Hugging Face format (``model.safetensors`` + the source checkpoint's config and tokenizer files),
  gathered over tp and pp and written by global rank 0 -- ``AutoModelForCausalLM`` / `TransformersModel` /
  `TorchSampler` / vLLM load it;
- LoRA: PEFT format (``adapter_config.json`` + ``adapter_model.safetensors``);
- ``twinkle_checkpoint.json`` and ``training_state.pt`` (counters, LR scheduler, RNG) as every backend writes them
  (`twinkle_core.train.checkpoint_dir`), with ``backend: megatron`` and the layout;
- ``save_optimizer=True`` also writes ``optimizer/tp{t}_pp{p}[_ep{e}_dp{d}].pt`` per model-parallel rank
  (Megatron's optimizer state; the distributed optimizer's shards gathered over dp in ``*_params.pt``): a resume
  needs the same layout.

The directory is written atomically: rank 0 creates the temporary directory and shares its path, every rank
writes its files, rank 0 renames it into place after a barrier.
"""

from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from twinkle_core.errors import InvalidInputError
from twinkle_core.train.checkpoint_dir import atomic_directory
from twinkle_core.utils.json import to_json
from twinkle_megatron import export, groups, lora, value_head
from twinkle_megatron.architecture import Architecture

OPTIMIZER_DIR = 'optimizer'
_WEIGHT_FILES = ('.safetensors', '.bin', '.pt', '.pth', 'safetensors.index.json', 'bin.index.json')


@contextmanager
def collective_directory(target: Path) -> Iterator[Path]:
    """`atomic_directory` for all ranks: every rank gets the same temporary path; rank 0 commits it."""
    if dist.get_rank() == 0:
        with atomic_directory(target) as tmp:
            box = [str(tmp)]
            dist.broadcast_object_list(box, src=0)
            yield tmp
            dist.barrier()
    else:
        received: list[Any] = [None]
        dist.broadcast_object_list(received, src=0)
        yield Path(received[0])
        dist.barrier()
    dist.barrier()  # nobody reads the checkpoint before it is in place


def copy_model_files(source_dir: str | Path, directory: Path) -> None:
    """The source checkpoint's config, generation config and tokenizer files (not its weights)."""
    for f in Path(source_dir).iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_FILES) and not f.name.startswith(('twinkle_', 'adapter_')):
            shutil.copy2(f, directory / f.name)


def save_full(chunks: list, arch: Architecture, directory: Path, *, source_dir: str, expert_offset: int = 0) -> None:
    """Gather the base weights and (rank 0) write them in Hugging Face format. Collective."""
    tensors = {
        name: t.detach().cpu().contiguous()
        for name, t in export.hf_base_weights(chunks, arch, expert_offset)
        if not (arch.tied_embeddings and name == 'lm_head.weight')
    }  # HF files leave a tied head out
    if dist.get_rank() == 0:
        from safetensors.torch import save_file

        copy_model_files(source_dir, directory)
        if arch.value_head:
            value_head.write_config(directory / 'config.json')
        save_file(tensors, str(directory / 'model.safetensors'), metadata={'format': 'pt'})


def save_lora(
    chunks: list, arch: Architecture, config: Any, directory: Path, *, adapter: str, base_model_id: str
) -> None:
    """Gather adapter `adapter` and (rank 0) write it in PEFT format. Collective."""
    tensors = {key: t.detach().cpu().contiguous() for key, t in export.peft_weights(chunks, arch, adapter)}
    if dist.get_rank() == 0:
        from safetensors.torch import save_file

        fields = peft_config_dict(config, base_model_id)
        (directory / 'adapter_config.json').write_text(json.dumps(fields, indent=2))
        save_file(tensors, str(directory / 'adapter_model.safetensors'), metadata={'format': 'pt'})


def peft_config_dict(config: Any, base_model_id: str) -> dict[str, Any]:
    """``adapter_config.json`` fields of a `peft.LoraConfig` (target modules as a sorted list)."""
    fields = to_json(config.to_dict())
    fields['base_model_name_or_path'] = base_model_id
    fields['target_modules'] = sorted(lora.target_projections(config.target_modules))
    return fields


@torch.no_grad()
def load_lora(chunks: list, arch: Architecture, directory: str | Path, *, adapter: str, tp: int, tp_rank: int) -> None:
    """Copy a PEFT adapter's factors into this rank's shards of adapter `adapter` (every factor of it must be in
    the file), and the weights trained in full beside it (a value model's head)."""
    from safetensors.torch import load_file

    path = Path(directory) / 'adapter_model.safetensors'
    if not path.exists():
        raise InvalidInputError(f'{directory} has no adapter_model.safetensors (PEFT format).')
    tensors = {k.replace('.default.', '.'): v for k, v in load_file(str(path)).items()}
    for key, param, dim, part in lora.factors(chunks, adapter):
        if key not in tensors:
            raise InvalidInputError(f'{path} has no {key!r}: the adapter does not match this model.')
        full = tensors[key]
        if part == lora.OUTPUT and dim == 0:  # the output layer's rows: pad the vocabulary as the model does
            full = torch.cat([full, full.new_zeros(param.shape[0] * tp - full.shape[0], *full.shape[1:])])
        shard = full.chunk(tp, dim=dim)[tp_rank] if dim is not None and tp > 1 else full
        if tuple(shard.shape) != tuple(param.shape):
            raise InvalidInputError(
                f'{key}: shape {tuple(tensors[key].shape)} does not fit this adapter (its rank or the model differ).'
            )
        param.copy_(shard)
    for name, param in value_head.trained_in_full(chunks):
        key = value_head.peft_full_key(arch, name)
        if key not in tensors or tuple(tensors[key].shape) != tuple(param.shape):
            raise InvalidInputError(f'{path} has no {key!r} of shape {tuple(param.shape)} (the value head).')
        param.copy_(tensors[key])


def optimizer_files(directory: str | Path) -> tuple[Path, Path]:
    """This rank's optimizer state file and the distributed optimizer's parameter-state file. Replicas along dp
    share them; under expert parallelism every rank keeps its own (its experts' state differs)."""
    r, ep = groups.ranks(), groups.expert_parallel_size()
    name = f'tp{r["tp"]}_pp{r["pp"]}' + (f'_ep{r["ep"]}_dp{r["dp"]}' if ep > 1 else '')
    base = Path(directory) / OPTIMIZER_DIR / name
    return base.with_suffix('.pt'), base.with_name(base.name + '_params.pt')


def save_optimizer(state: Any, directory: Path) -> None:
    """Every rank: its optimizer shard (one writer per file; collective for the distributed optimizer)."""
    files = optimizer_files(directory)
    files[0].parent.mkdir(exist_ok=True)
    state.save_shard(*files, write=groups.expert_parallel_size() > 1 or groups.ranks()['dp'] == 0)


def load_optimizer(state: Any, directory: str | Path) -> None:
    files = optimizer_files(directory)
    if not files[0].exists():
        raise InvalidInputError(
            f'{directory} has no optimizer state for this rank ({files[0].name}): it was saved '
            f'without save_optimizer=True or with another tensor/pipeline layout.'
        )
    state.load_shard(*files)
