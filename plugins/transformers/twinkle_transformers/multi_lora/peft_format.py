"""Read and write adapters in PEFT's on-disk format (``adapter_config.json`` + ``adapter_model.safetensors``).

A directory written here loads with plain ``peft.PeftModel.from_pretrained(base_model, path)`` and gives the same
logits; any PEFT LoRA directory within the supported feature set (see `adapter_config`) loads here.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_transformers.multi_lora.adapter_config import ModuleLoraShape, saveable_config, to_lora_config

WEIGHTS_NAME = 'adapter_model.safetensors'
LEGACY_WEIGHTS_NAME = 'adapter_model.bin'
CONFIG_NAME = 'adapter_config.json'


def write_peft_adapter(
    path: str | os.PathLike,
    config: Any,
    targets: dict[str, ModuleLoraShape],
    state_dict: dict[str, torch.Tensor],
    base_model_name_or_path: str | None,
) -> str:
    """Write config and weights into directory `path` (created if needed); files are replaced atomically."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    saveable_config(config, targets, base_model_name_or_path).save_pretrained(str(out))
    tensors = {k: v.detach().to('cpu').contiguous() for k, v in state_dict.items()}
    fd, tmp = tempfile.mkstemp(dir=out, prefix='.adapter_model.', suffix='.tmp')
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={'format': 'pt'})
        os.replace(tmp, out / WEIGHTS_NAME)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return str(out)


def read_peft_adapter(path: str | os.PathLike) -> tuple[Any, dict[str, torch.Tensor]]:
    """(LoraConfig, peft-format state dict) of a PEFT adapter directory. Raises naming the missing file."""
    from peft import LoraConfig

    src = Path(path)
    if not (src / CONFIG_NAME).is_file():
        raise InvalidInputError(f'{src} is not a PEFT adapter directory: {CONFIG_NAME} is missing.')
    peft_type = json.loads((src / CONFIG_NAME).read_text()).get('peft_type', 'LORA')
    if peft_type != 'LORA':
        raise InvalidInputError(f'{src} holds a {peft_type} adapter; only LoRA adapters are supported.')
    config = to_lora_config(LoraConfig.from_pretrained(str(src)))
    config.inference_mode = False
    if (src / WEIGHTS_NAME).is_file():
        from safetensors.torch import load_file

        state_dict = load_file(str(src / WEIGHTS_NAME))
    elif (src / LEGACY_WEIGHTS_NAME).is_file():
        state_dict = torch.load(src / LEGACY_WEIGHTS_NAME, map_location='cpu', weights_only=True)
    else:
        raise InvalidInputError(f'{src} has {CONFIG_NAME} but no {WEIGHTS_NAME}; the checkpoint is incomplete.')
    return config, state_dict
