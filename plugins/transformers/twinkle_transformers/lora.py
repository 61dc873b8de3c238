"""LoRA configuration: a `peft.LoraConfig`, or a dict of its fields, as a causal-LM `LoraConfig`."""

from __future__ import annotations

from typing import Any

from twinkle_core.errors import InvalidInputError
from twinkle_core.utils.json import to_json
from twinkle_transformers.vision import lora_target_fields

DEFAULT_TARGET_MODULES = 'all-linear'


def lora_config(config: Any, *, model: Any = None, **overrides: Any) -> Any:
    """`config` (LoraConfig | dict | None) plus `overrides` -> a `LoraConfig` with ``task_type='CAUSAL_LM'``.

    A dict without ``target_modules`` targets every linear layer except the output head (``'all-linear'``);
    given the `model`, target groups resolve for it (`twinkle_transformers.vision.lora_target_fields`: on a
    vision-language model 'all-linear' leaves the vision tower alone). Unknown fields raise `InvalidInputError`
    naming them.
    """
    from peft import LoraConfig

    if isinstance(config, LoraConfig):
        if not overrides and model is None:
            return config
        config = config.to_dict()
    fields = dict(config or {}) | overrides
    fields.setdefault('target_modules', DEFAULT_TARGET_MODULES)
    if model is not None:
        fields = lora_target_fields(fields, model)
    fields.setdefault('task_type', 'CAUSAL_LM')
    fields.pop('peft_type', None)
    known = set(LoraConfig.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InvalidInputError(
            f'Unknown LoRA config fields {unknown}; see peft.LoraConfig for the valid ones '
            f'(e.g. r, lora_alpha, lora_dropout, target_modules).'
        )
    return LoraConfig(**fields)


def lora_config_json(config: Any) -> dict[str, Any]:
    """`config.to_dict()` with plain JSON values: enums by value, sets as sorted lists, anything else as text."""
    return to_json(config.to_dict())
