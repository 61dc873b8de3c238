"""Vision-language models (Qwen3-VL, Qwen3.5): what changes between a text batch and an image + text batch.

A VL model takes the collated image fields (``pixel_values``, ``image_grid_thw``, ``mm_token_type_ids``, see
`twinkle_core.processor.causal_lm`) and multimodal RoPE positions. Those positions are always computed here,
per row, from the row's own tokens and images, and passed as ``[4, B, T]`` (row 0: the text positions, which
restart at 0 per row; rows 1-3: temporal/height/width M-RoPE). The model's own position inference is never used
because it is stateful (it reuses the ``rope_deltas`` of the previous call) and does not restart positions per
packed row. With these positions, ``attention_mask=None`` and ``use_cache=False``, a padding-free packed batch
gives the same logits as the padded one (tested for Qwen3-VL).

Packing is refused for models with linear-attention layers (Qwen3.5's gated DeltaNet): without the
flash-linear-attention kernels their recurrence runs across row borders; such models train on padded batches.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import TOKEN_TYPE_FIELD

#: Module-name pattern of vision towers: LoRA stays off them unless asked (``exclude_modules`` in the LoRA config).
VISION_TOWER_PATTERN = r'.*\.visual\..*'


#: ``target_modules`` groups of a LoRA config (any model; 'vision' needs a VL model). 'all-linear' means
#: 'language' on VL models, like the other names it applies to the linear layers except the output head.
LORA_TARGET_GROUPS = ('language', 'vision', 'all')


def lora_target_fields(fields: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """LoRA config `fields` with target groups resolved for `model`.

    On a VL model, ``'all-linear'`` / ``'language'`` adapt the language model's linear layers only (the vision
    tower excluded), ``'vision'`` the vision tower's only, ``'all'`` both. A list may mix groups and module
    names (``['language', 'lm_head']``); groups in a list become explicit module names. Other module lists and
    regexes pass unchanged. On a text model every group is ``'all-linear'`` except ``'vision'``, an error.
    """
    target = fields.get('target_modules')
    if isinstance(target, (list, tuple, set)) and any(str(t).lower() in LORA_TARGET_GROUPS for t in target):
        names: list[str] = []
        for item in target:
            names += _group_modules(model, item.lower()) if str(item).lower() in LORA_TARGET_GROUPS else [item]
        return {**fields, 'target_modules': list(dict.fromkeys(names))}
    if not isinstance(target, str) or target.lower() not in (*LORA_TARGET_GROUPS, 'all-linear'):
        return fields
    group = target.lower()
    if group == 'vision':
        return {**fields, 'target_modules': _group_modules(model, group)}
    if (
        group == 'all'
        or not is_vision_language(getattr(model, 'config', None))
        or fields.get('exclude_modules') is not None
    ):
        return {**fields, 'target_modules': 'all-linear'}
    return {**fields, 'target_modules': 'all-linear', 'exclude_modules': VISION_TOWER_PATTERN}


def _group_modules(model: torch.nn.Module, group: str) -> list[str]:
    """Names of the linear layers of a target group (the output head is never in one)."""
    if group == 'vision' and not is_vision_language(getattr(model, 'config', None)):
        raise InvalidInputError(
            f"target_modules='vision' needs a vision-language model; {type(model).__name__} has no vision tower."
        )
    get_output = getattr(model, 'get_output_embeddings', None)  # an HF PreTrainedModel's
    head = get_output() if get_output is not None else None
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is head:
            continue
        in_vision = '.visual.' in f'.{name}.'
        if group == 'all' or (group == 'vision') == in_vision:
            names.append(name)
    return names


def is_vision_language(config: Any) -> bool:
    """True for a vision-language model config (one with a ``vision_config``)."""
    return getattr(config, 'vision_config', None) is not None


def language_config(config: Any) -> Any:
    """The language model's config: ``config.text_config`` of a VL model, `config` itself otherwise."""
    return getattr(config, 'text_config', None) or config


def has_linear_attention(config: Any) -> bool:
    return 'linear_attention' in (getattr(language_config(config), 'layer_types', None) or ())


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The vision encoder of a VL model (``model.visual`` in the Qwen-VL families), or None."""
    for name, module in model.named_modules():
        if name.endswith('.visual') or name == 'visual':
            return module
    return None


def _rope_owner(model: torch.nn.Module) -> Any:
    for module in model.modules():
        if callable(getattr(module, 'get_rope_index', None)):
            return module
    raise InvalidInputError(
        f'{type(model).__name__} is a vision-language model without get_rope_index; '
        'twinkle supports the Qwen-VL families (Qwen2-VL .. Qwen3-VL, Qwen3.5).'
    )


def add_vision_inputs(
    model: torch.nn.Module, config: Any, batch: dict[str, Any], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """`kwargs` (from `model_call_kwargs`) plus the image inputs and M-RoPE positions a VL model needs."""
    if batch.get('packed') and has_linear_attention(config):
        raise InvalidInputError(
            f'{type(model).__name__} has linear-attention layers, which cannot keep packed rows apart without the '
            'flash-linear-attention kernels: train it on padded batches (padding_free=False).'
        )
    ids = batch['input_ids']
    types = batch.get(TOKEN_TYPE_FIELD)
    if types is None:
        types = torch.zeros_like(ids)
    out = dict(kwargs)
    out[TOKEN_TYPE_FIELD] = types
    out['position_ids'] = mrope_position_ids(model, batch, types)
    if batch.get('pixel_values') is not None:
        out['pixel_values'] = batch['pixel_values']
        out['image_grid_thw'] = batch['image_grid_thw']
    return out


def mrope_position_ids(model: torch.nn.Module, batch: dict[str, Any], types: torch.Tensor) -> torch.Tensor:
    """``[4, B, T]`` positions: the batch's text positions, then the M-RoPE positions of each row's tokens."""
    text = batch['position_ids']
    mrope = text[None].expand(3, -1, -1).clone()
    grids = batch.get('image_grid_thw')
    counts = batch.get('image_counts') or []
    if grids is not None and any(counts):
        owner = _rope_owner(model)
        ids = batch['input_ids']
        first_image = 0
        for row, (b, start, end) in enumerate(_row_spans(batch)):
            count = counts[row]
            if count:
                positions, _ = owner.get_rope_index(
                    ids[b : b + 1, start:end],
                    types[b : b + 1, start:end],
                    image_grid_thw=grids[first_image : first_image + count],
                )
                mrope[:, b, start:end] = positions[:, 0].to(mrope)
            first_image += count
    return torch.cat([text[None], mrope])


def _row_spans(batch: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of each input row: one per padded row, back to back in a packed batch."""
    lengths = batch['row_lengths']
    if batch.get('packed'):
        spans, start = [], 0
        for n in lengths:
            spans.append((0, start, start + n))
            start += n
        return spans
    return [(b, 0, n) for b, n in enumerate(lengths)]


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """``requires_grad=False`` on every parameter of the vision tower; returns how many tensors were frozen."""
    tower = vision_tower(model)
    if tower is None:
        raise InvalidInputError(f'{type(model).__name__} has no vision tower to freeze.')
    frozen = 0
    for parameter in tower.parameters():
        if parameter.requires_grad:
            parameter.requires_grad_(False)
            frozen += 1
    return frozen
