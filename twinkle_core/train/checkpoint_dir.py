"""Backend-neutral checkpoint directories: written atomically (into a temporary sibling, then renamed), with
``twinkle_checkpoint.json`` (what was saved) and, for resumable checkpoints, ``training_state.pt``: a `TrainState`
(optimizer, LR scheduler, counters), the RNG states (torch CPU/CUDA, python, numpy), an optional data-loader state
and optional caller ``extra_state`` -- read with ``torch.load(weights_only=True)``: plain python values and tensors
only. What a backend writes next to them (PEFT adapter files, Hugging Face weights) is the backend's business.
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
    raise InvalidInputError(
        f'{str(directory)!r} is not a checkpoint: it has neither {METADATA_FILE}, '
        f'adapter_config.json (PEFT) nor config.json (Hugging Face).'
    )


# ---- training state ----------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Every global RNG state, as plain python values and tensors (loadable with ``weights_only=True``)."""
    import numpy as np

    name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state = {
        'python': random.getstate(),
        'numpy': (name, np.asarray(keys).tolist(), pos, has_gauss, gauss),
        'torch': torch.get_rng_state(),
    }
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


def save_training_state(
    directory: Path, train_state: dict[str, Any], *, dataloader: Any = None, extra_state: Any = None
) -> None:
    payload = {
        'train_state': train_state,
        'rng': rng_state(),
        'extra_state': extra_state,
        'dataloader': dataloader.state_dict() if dataloader is not None else None,
    }
    torch.save(payload, directory / TRAINING_STATE_FILE)


def load_training_state(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(directory) / TRAINING_STATE_FILE
    if not path.exists():
        raise InvalidInputError(
            f'{str(directory)!r} has no {TRAINING_STATE_FILE}; it was saved without '
            f'save_optimizer=True, so only its weights can be loaded (load_optimizer=False).'
        )
    return torch.load(path, map_location='cpu', weights_only=True)


def restore_run_state(saved: dict[str, Any], dataloader: Any = None) -> Any:
    """The run-wide part of a loaded training state (`load_training_state`): the RNG states and, given a
    `dataloader`, its position; returns the caller's saved `extra_state`."""
    set_rng_state(saved['rng'])
    if dataloader is not None and saved.get('dataloader') is not None:
        dataloader.load_state_dict(saved['dataloader'])
    return saved.get('extra_state')
