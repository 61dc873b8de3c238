"""Sharded checkpoints of `TransformersModel`, written with ``torch.distributed.checkpoint`` (DCP).

Every rank writes its own shards of the weights and the optimizer state (nothing is gathered onto rank 0), and
any world size reads them back, resharded to its own mesh. The directory is a twinkle checkpoint
(`twinkle_core.train.checkpoint_dir`) whose ``twinkle_checkpoint.json`` says ``"format": "dcp"``:

- ``dcp/``: the DCP files (``.metadata`` + one ``*.distcp`` per rank): ``model.<name>`` -- every parameter and
  buffer of a full model, the trainable (LoRA) parameters of an adapter -- and, with ``save_optimizer=True``
  after the first optimizer step, ``optimizer.*`` (the state keyed by parameter name);
- written by rank 0: ``adapter_config.json`` (LoRA) or the Hugging Face ``config.json`` and tokenizer files
  (full), and ``training_state.pt`` (the `TrainState` counters, scheduler, RNG and data-loader states; its
  optimizer entry is ``{'in_dcp': True}`` when the state is in ``dcp/``).

Ranks must share the checkpoint's file system. `export_checkpoint` turns a checkpoint into a plain Hugging Face /
PEFT directory for serving, reading one tensor at a time.
"""

from __future__ import annotations

import json
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.runtime import distributed
from twinkle_transformers import checkpoint as ckpt
from twinkle_transformers import mesh_checkpoint
from twinkle_transformers.checkpoint import CheckpointedModel

if TYPE_CHECKING:
    import os


FORMAT = 'dcp'  # the ``format`` field of twinkle_checkpoint.json
DCP_DIR = 'dcp'
OPTIMIZER_IN_DCP = {'in_dcp': True}  # training_state.pt's optimizer entry when the state is in dcp/


def is_sharded_checkpoint(meta: dict[str, Any]) -> bool:
    """True for the metadata (`checkpoint_dir.read_metadata`) of a checkpoint written by `save`."""
    return meta.get('format') == FORMAT


# ---- save --------------------------------------------------------------------------------------------------
def save(
    model: CheckpointedModel,
    target: Path,
    *,
    save_optimizer: bool,
    adapter_name: str | None,
    dataloader: Any,
    extra_state: Any,
) -> None:
    """Write `model` as a sharded checkpoint at `target` (collective under a process group; atomic)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = model.train_state(adapter_name)
    module = model.model
    tensors: dict[str, Any] = {'model': _model_state(module, lora=model.adapter_name is not None)}
    optimizer_state: dict[str, Any] | None = None
    if save_optimizer and state.optimizer is not None:
        if state.optimizer.state:
            mesh_checkpoint.reshard(module)
            tensors['optimizer'] = get_optimizer_state_dict(module, state.optimizer)
            optimizer_state = OPTIMIZER_IN_DCP
        else:  # before the first step: hyper-parameters only (DCP would initialise the state by stepping)
            optimizer_state = mesh_checkpoint.full_optimizer_state_dict(module, state.optimizer)

    def write_shards(directory: Path) -> None:
        import torch.distributed.checkpoint as dcp

        with _one_process_is_intended():
            dcp.save(tensors, checkpoint_id=str(directory / DCP_DIR), no_dist=not distributed.is_initialized())

    def write_rank0_files(directory: Path) -> None:
        if model.adapter_name is not None:
            peft_model: Any = module  # a PeftModel: `peft_config` is a plain attribute
            ckpt.save_lora_config(peft_model.peft_config[model.adapter_name], directory, base_model_id=model.model_id)
        else:
            hf_model: Any = module  # what save_pretrained writes besides the weights
            hf_model.config.save_pretrained(str(directory))
            if getattr(hf_model, 'generation_config', None) is not None:
                hf_model.generation_config.save_pretrained(str(directory))
            if model.tokenizer is not None:
                model.tokenizer.save_pretrained(str(directory))
            ckpt.copy_processor_files(model.model_dir, directory)
        ckpt.write_metadata(
            directory,
            kind='lora' if model.adapter_name else 'full',
            adapter_name=model.adapter_name,
            model_id=model.model_id,
            step=state.optimizer_steps,
            has_training_state=save_optimizer,
            format=FORMAT,
            world_size=distributed.get_world_size(),
        )
        if save_optimizer:
            ckpt.save_training_state(
                directory,
                {**state.state_dict(), 'optimizer': optimizer_state},
                dataloader=dataloader,
                extra_state=extra_state,
            )

    _write_together(target, write_shards, write_rank0_files)


def _write_together(target: Path, write_shards: Callable[[Path], None], write_rank0: Callable[[Path], None]) -> None:
    """Every rank writes its shards into one temporary directory (named by rank 0) that replaces `target` once
    rank 0 has written its files too."""
    import torch.distributed as dist

    if not distributed.is_initialized():
        with ckpt.atomic_directory(target) as tmp:
            write_shards(tmp)
            write_rank0(tmp)
        return
    if distributed.is_main_process():
        with ckpt.atomic_directory(target) as tmp:
            dist.broadcast_object_list([str(tmp)], src=0)
            write_shards(tmp)  # DCP's last step gathers every rank's write results: all shards are on disk after it
            write_rank0(tmp)
    else:
        name: list[Any] = [None]
        dist.broadcast_object_list(name, src=0)
        write_shards(Path(name[0]))
    distributed.barrier()


@contextmanager
def _one_process_is_intended() -> Iterator[None]:
    """Silence DCP's warning that it assumes one process without a process group: that is what we ask for."""
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='torch.distributed is disabled', category=UserWarning)
        yield


def _model_state(module: torch.nn.Module, *, lora: bool) -> dict[str, Any]:
    """The module's state dict as DCP reads and writes it (DTensor shards under FSDP2/TP); LoRA: trainable only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(ignore_frozen_params=lora))


# ---- load --------------------------------------------------------------------------------------------------
def load_weights(model: CheckpointedModel, path: str | os.PathLike[str], meta: dict[str, Any]) -> None:
    """Read the weights of sharded checkpoint `path` into `model` (its adapter already matches `meta`), resharded
    to the model's current layout. Collective under a process group."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if meta['kind'] == 'lora' and model.adapter_name != meta.get('adapter_name'):
        raise InvalidInputError(
            f'{str(path)!r} is a sharded checkpoint of adapter {meta.get("adapter_name")!r}; load it into a model '
            f'without adapter or with adapter {meta.get("adapter_name")!r}, not {model.adapter_name!r}.'
        )
    lora = model.adapter_name is not None
    state = _model_state(model.model, lora=lora)
    _check_model_keys(path, state, meta)
    with _one_process_is_intended():
        dcp.load({'model': state}, checkpoint_id=str(Path(path) / DCP_DIR), no_dist=not distributed.is_initialized())
    set_model_state_dict(model.model, state, options=StateDictOptions(ignore_frozen_params=lora, strict=not lora))


def load_optimizer_state(
    module: torch.nn.Module, path: str | os.PathLike[str], optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> None:
    """`TrainState.load_state_dict`'s optimizer loader for sharded checkpoint `path` (resharded; collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    if saved != OPTIMIZER_IN_DCP:  # saved before the first step: name-keyed hyper-parameters
        mesh_checkpoint.load_optimizer_state(module, optimizer, saved)
        return
    mesh_checkpoint.reshard(module)
    state = get_optimizer_state_dict(module, optimizer)  # the layout to fill (initialises an empty state)
    with _one_process_is_intended():
        dcp.load(
            {'optimizer': state}, checkpoint_id=str(Path(path) / DCP_DIR), no_dist=not distributed.is_initialized()
        )
    set_optimizer_state_dict(module, optimizer, optim_state_dict=state)


def _check_model_keys(path: str | os.PathLike[str], state: dict[str, Any], meta: dict[str, Any]) -> None:
    saved = _saved_model_tensors(path)
    missing = sorted(set(state) - set(saved))
    unexpected = sorted(set(saved) - set(state))
    wrong = [k for k in sorted(set(state) & set(saved)) if tuple(state[k].shape) != saved[k][1]]
    if missing or unexpected or wrong:
        raise InvalidInputError(
            f'Sharded checkpoint {str(path)!r} ({meta["kind"]}, model {meta.get("model_id")!r}) does not match '
            f'this model: missing {missing[:3]} ({len(missing)}), unexpected {unexpected[:3]} ({len(unexpected)}), '
            f'other shapes {wrong[:3]} ({len(wrong)}). Was it saved from another base model or LoRA config?'
        )


def _saved_model_tensors(path: str | os.PathLike[str]) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Parameter name -> (dtype, full shape) of every model tensor of sharded checkpoint `path`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    entries = FileSystemReader(str(Path(path) / DCP_DIR)).read_metadata().state_dict_metadata
    return {
        key.removeprefix('model.'): (entry.properties.dtype, tuple(entry.size))
        for key, entry in entries.items()
        if key.startswith('model.') and isinstance(entry, TensorStorageMetadata)
    }


# ---- export ------------------------------------------------------------------------------------------------
def export_checkpoint(
    checkpoint: str | os.PathLike[str], output_dir: str | os.PathLike[str], *, max_shard_bytes: int = 2 << 30
) -> str:
    """Write checkpoint `checkpoint` (sharded or not) as a plain Hugging Face / PEFT directory at `output_dir`
    (loadable with ``from_pretrained`` / ``PeftModel.from_pretrained``); returns it. One process (e.g. rank 0)
    runs it; a sharded checkpoint is read one tensor at a time and full weights are written in safetensors files
    of at most `max_shard_bytes` (plus ``model.safetensors.index.json`` when there are several), so memory
    holds one file's tensors at most. A consolidated checkpoint is copied without the twinkle files."""
    source = Path(checkpoint)
    meta = ckpt.read_metadata(source)
    skip = {ckpt.METADATA_FILE, ckpt.TRAINING_STATE_FILE, DCP_DIR}
    with ckpt.atomic_directory(output_dir) as tmp:
        for item in source.iterdir():
            if item.is_file() and item.name not in skip:
                shutil.copyfile(item, tmp / item.name)
        if is_sharded_checkpoint(meta):
            if meta['kind'] == 'lora':
                _export_adapter(source, tmp, meta['adapter_name'])
            else:
                _export_full(source, tmp, max_shard_bytes)
    return str(output_dir)


def _read_tensor(source: Path, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    import torch.distributed.checkpoint as dcp

    tensor = torch.empty(shape, dtype=dtype)
    with _one_process_is_intended():
        dcp.load({'model': {name: tensor}}, checkpoint_id=str(source / DCP_DIR), no_dist=True)
    return tensor


def _export_adapter(source: Path, directory: Path, adapter_name: str) -> None:
    from safetensors.torch import save_file

    tensors = {  # PEFT's file keys: the parameter names without the adapter name
        name.replace(f'.{adapter_name}', ''): _read_tensor(source, name, dtype, shape)
        for name, (dtype, shape) in _saved_model_tensors(source).items()
    }
    save_file(tensors, str(directory / 'adapter_model.safetensors'), metadata={'format': 'pt'})


def _export_full(source: Path, directory: Path, max_shard_bytes: int) -> None:
    from safetensors.torch import save_file

    saved = _saved_model_tensors(source)
    files: list[list[str]] = [[]]
    size = 0
    for name, (dtype, shape) in saved.items():
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        if files[-1] and size + nbytes > max_shard_bytes:
            files.append([])
            size = 0
        files[-1].append(name)
        size += nbytes
    names = (
        ['model.safetensors']
        if len(files) == 1
        else [f'model-{i + 1:05d}-of-{len(files):05d}.safetensors' for i in range(len(files))]
    )
    for file_name, members in zip(names, files):
        tensors = {name: _read_tensor(source, name, *saved[name]) for name in members}
        save_file(tensors, str(directory / file_name), metadata={'format': 'pt'})
    if len(files) > 1:
        total = sum(torch.Size(shape).numel() * dtype.itemsize for dtype, shape in saved.values())
        index = {'metadata': {'total_size': total}, 'weight_map': {n: f for f, m in zip(names, files) for n in m}}
        (directory / 'model.safetensors.index.json').write_text(json.dumps(index, indent=2))
