"""Where a sampler's weights come from: its own copy loaded from a path, or a model shared with a trainer."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_transformers.vision import is_vision_language


@dataclass
class ModelSource:
    module: torch.nn.Module
    tokenizer: Any
    model_id: str | None
    owned: bool  # True: loaded by the sampler; False: shared (in-place changes are visible to the owner)
    owner: Any = None  # the wrapper the module came from (re-read on use: e.g. a model that gains a PEFT wrapper)


def open_model(
    model_id: str | os.PathLike[str] | None,
    *,
    model: Any,
    tokenizer: Any,
    device: str | torch.device | None,
    dtype: Any,
) -> ModelSource:
    if (model_id is None) == (model is None):
        raise InvalidInputError('Pass exactly one of model_id= (a model directory) or model= (a model to share).')
    if model is not None:
        module = unwrap_module(model)
        if device is not None and torch.device(device) != next(module.parameters()).device:
            raise InvalidInputError(
                f'model= lives on {next(module.parameters()).device} but device={device} was '
                'asked; a shared model is used where it is.'
            )
        tokenizer = tokenizer if tokenizer is not None else getattr(model, 'tokenizer', None)
        name = getattr(getattr(module, 'config', None), '_name_or_path', None) or None
        if tokenizer is None and name and os.path.isdir(name):
            tokenizer = _load_tokenizer(name)
        return ModelSource(
            module, tokenizer, name, owned=False, owner=None if isinstance(model, torch.nn.Module) else model
        )
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    assert model_id is not None  # exactly one of model_id / model, checked above
    path = os.fspath(model_id)
    target = (
        torch.device(device) if device is not None else torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    )
    if dtype is None:  # fp32 on CPU (bf16 matmuls are slow there); the checkpoint's dtype on accelerators
        dtype = torch.float32 if target.type == 'cpu' else 'auto'
    # vision-language checkpoints (Qwen3-VL, Qwen3.5) have no causal-LM class: image + text in, text out
    auto = AutoModelForImageTextToText if is_vision_language(AutoConfig.from_pretrained(path)) else AutoModelForCausalLM
    # transformers types `PreTrainedModel.to` via functools.wraps(nn.Module.to), which loses the bound self
    module = auto.from_pretrained(path, dtype=dtype).to(target).eval()  # type: ignore[arg-type]
    module.requires_grad_(False)
    return ModelSource(module, tokenizer if tokenizer is not None else _load_tokenizer(path), path, owned=True)


def unwrap_module(model: Any) -> torch.nn.Module:
    """The `torch.nn.Module` behind `model`: itself, or the module a twinkle model wraps."""
    if isinstance(model, torch.nn.Module):
        return model
    for attr in ('unwrap_model', 'hf_model', 'model', 'module'):
        inner = getattr(model, attr, None)
        inner = inner() if callable(inner) and not isinstance(inner, torch.nn.Module) else inner
        if isinstance(inner, torch.nn.Module):
            return inner
    raise InvalidInputError(f'model= must be a torch/transformers model or wrap one (got {type(model).__name__}).')


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):  # a weights-only directory: the sampler still works on token ids
        return None
