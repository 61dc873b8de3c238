"""Load a Hugging Face causal LM for training: where it comes from, which device and dtype it runs in.

`model_id` may be a local directory, ``ms://org/repo[@rev]`` (ModelScope), ``hf://org/repo[@rev]`` (Hugging Face),
or a plain Hugging Face id. Devices: CUDA (``cuda:$LOCAL_RANK`` under torchrun), then Apple MPS, then CPU.
Dtypes: bfloat16 on GPUs, float32 on CPU, unless given.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle_core.train.model_loading import load_tokenizer_if_any, resolve_dtype, resolve_model_dir
from twinkle_transformers import attention
from twinkle_transformers.vision import is_vision_language, language_config


def load_causal_lm(
    model_dir: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    attn_implementation: str | None,
    **from_pretrained_kwargs: Any,
) -> torch.nn.Module:
    """`AutoModelForCausalLM.from_pretrained` on `device` in `dtype` (KV cache off: this model trains);
    vision-language checkpoints load through ``AutoModelForImageTextToText``.

    `attn_implementation` None: ``twinkle_sdpa`` (SDPA that attends per sequence in padding-free batches, see
    `twinkle_transformers.attention`) for models that support SDPA, else transformers' default.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    kwargs = dict(from_pretrained_kwargs)
    config = AutoConfig.from_pretrained(model_dir, **config_kwargs(kwargs))
    if is_vision_language(config):  # Qwen3-VL, Qwen3.5: image + text in, text out; transformers' attention
        model = AutoModelForImageTextToText.from_pretrained(
            model_dir,
            dtype=dtype,
            **({'attn_implementation': attn_implementation} if attn_implementation else {}),
            **kwargs,
        )
        model.config.use_cache = False
        # transformers types `PreTrainedModel.to` via functools.wraps(nn.Module.to), which loses the bound self
        return model.to(device)  # type: ignore[arg-type]
    attn_implementation = resolve_attention(config, attn_implementation)
    if attn_implementation is not None:
        kwargs['attn_implementation'] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **kwargs)
    model.config.use_cache = False
    return model.to(device)  # type: ignore[arg-type]  # as above: `.to`'s self is lost in transformers' types


def resolve_attention(config: Any, attn_implementation: str | None) -> str | None:
    """The attention implementation to load `config`'s model with: ``twinkle_sdpa`` (registered) when none is
    asked for and the model supports SDPA, else the one asked for (None: transformers' default)."""
    if attn_implementation is None and _supports_sdpa(config):
        return attention.register()
    if attn_implementation == attention.ATTN_IMPLEMENTATION:
        attention.register()
    return attn_implementation


def config_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``from_pretrained`` keyword arguments that also apply to ``AutoConfig.from_pretrained``."""
    return {k: kwargs[k] for k in ('revision', 'trust_remote_code', 'token', 'cache_dir') if k in kwargs}


def _supports_sdpa(config: Any) -> bool:
    """Whether the causal-LM class of `config` can run SDPA attention (so ``twinkle_sdpa`` applies)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:  # remote-code or unknown architectures: keep transformers' default
        return False
    return bool(getattr(model_class, '_supports_sdpa', False))


def max_model_length(config: Any, override: int | None) -> tuple[int | None, str]:
    """The longest row the model accepts and where that limit comes from."""
    if override is not None:
        return int(override), 'max_length set on the model'
    limit = getattr(language_config(config), 'max_position_embeddings', None)
    return (int(limit), 'config.max_position_embeddings') if limit else (None, 'no limit')


def load_or_adopt(
    model_id: Any,
    model: torch.nn.Module | None,
    *,
    device: torch.device,
    dtype: Any,
    attn_implementation: str | None,
    **from_pretrained_kwargs: Any,
) -> tuple[torch.nn.Module, str, str, Any]:
    """``(model, model_id, model_dir, tokenizer)``: `model_id` loaded by `load_causal_lm` (with its tokenizer, if
    any), or an already loaded `model` moved to `device` (its ``_name_or_path`` as id and directory, no
    tokenizer). Exactly one of them is given (checked by the caller)."""
    if model is None:
        model_dir = resolve_model_dir(model_id)
        loaded = load_causal_lm(
            model_dir,
            device=device,
            dtype=resolve_dtype(dtype, device),
            attn_implementation=attn_implementation,
            **from_pretrained_kwargs,
        )
        return loaded, str(model_id), model_dir, load_tokenizer_if_any(model_dir)
    name = str(getattr(model.config, '_name_or_path', '') or type(model).__name__)
    return model.to(device), name, name, None
