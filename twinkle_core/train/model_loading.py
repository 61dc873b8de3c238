"""Loading a model, for every backend: where its weights come from (a model id -> local directory), the default
device they are loaded on (CUDA ``cuda:$LOCAL_RANK`` under torchrun, then Apple MPS, then CPU), the dtype (bfloat16 on
GPUs, float32 on CPU) and the tokenizer stored with them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.hub.download import snapshot
from twinkle_core.hub.ref import HubRef, is_hub_ref
from twinkle_core.template.tokenizer import load_tokenizer

_DTYPES = {
    'bf16': torch.bfloat16,
    'bfloat16': torch.bfloat16,
    'fp16': torch.float16,
    'float16': torch.float16,
    'half': torch.float16,
    'fp32': torch.float32,
    'float32': torch.float32,
    'float': torch.float32,
}


def resolve_model_dir(model_id: str | os.PathLike[str]) -> str:
    """A local directory for `model_id` (hub references are downloaded, or found in the hub client's cache)."""
    text = str(model_id)
    if is_hub_ref(text):
        return str(snapshot(HubRef.parse(text)))
    return text


def default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device('cuda', int(os.environ.get('LOCAL_RANK', 0)))
    mps = getattr(torch.backends, 'mps', None)
    if mps is not None and mps.is_available():
        return torch.device('mps')
    return torch.device('cpu')


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """`dtype` as a torch dtype; None -> bfloat16 on GPUs, float32 on CPU."""
    if dtype is None:
        return torch.float32 if device.type == 'cpu' else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise InvalidInputError(f'Unknown dtype {dtype!r}; use one of {", ".join(sorted(_DTYPES))} or a torch.dtype.')
    return _DTYPES[dtype]


def load_tokenizer_if_any(model_dir: str) -> Any:
    """The tokenizer stored with the model (`twinkle_core.template.tokenizer.load_tokenizer`), or None when the
    local directory has none."""
    local = Path(model_dir)
    if local.is_dir() and not any(local.glob('tokenizer*')):
        return None
    return load_tokenizer(model_dir)
