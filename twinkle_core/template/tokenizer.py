"""Tokenizer loading for templates: a tokenizer object, a local directory, ``ms://``/``hf://`` refs, or an HF id."""

from __future__ import annotations

import os
from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.hub.download import snapshot
from twinkle_core.hub.ref import HubRef, is_hub_ref


def load_tokenizer(model_id_or_tokenizer: Any, **kwargs: Any) -> Any:
    """Return a Hugging Face tokenizer.

    - an object with ``apply_chat_template`` is returned as is;
    - ``ms://org/name`` / ``hf://org/name[@rev]`` are fetched through `twinkle_core.hub` (cached; honours
      ``TWINKLE_HUB_OFFLINE`` / ``HF_HUB_OFFLINE`` / ``TWINKLE_HUB_ROOT``);
    - anything else goes to ``transformers.AutoTokenizer.from_pretrained`` (a local directory, or a Hugging Face
      id resolved from the HF cache when ``HF_HUB_OFFLINE=1``).
    """
    if hasattr(model_id_or_tokenizer, 'apply_chat_template'):
        return model_id_or_tokenizer
    source = resolve_source(model_id_or_tokenizer)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, **kwargs)
    except OSError as exc:
        raise InvalidInputError(
            f'Could not load a tokenizer from {model_id_or_tokenizer!r}: give a local model directory, an ms:// or '
            f'hf:// reference, or a cached Hugging Face id. ({exc})'
        ) from exc


def resolve_source(model_id: Any) -> str:
    """A local directory (hub references downloaded or found in the hub cache) or a plain HF id, as a string."""
    if not isinstance(model_id, (str, os.PathLike)):
        raise InvalidInputError(
            f'A template needs a tokenizer, a local model directory or a model id, got {type(model_id).__name__}.'
        )
    source = os.fspath(model_id)
    if is_hub_ref(source):
        source = str(snapshot(HubRef.parse(source)))
    return source
