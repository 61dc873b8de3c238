"""Image prompts in the decode loop of a vision-language model (Qwen3-VL, Qwen3.5): prefill inputs and positions.

The prefill gets the batch's images (``pixel_values`` / ``image_grid_thw`` of its image prompts, in batch order),
``mm_token_type_ids`` and explicit ``[4, B, L]`` positions: row 0 the text positions (counted from each prompt's
first real token, as the left-padded text path does), rows 1-3 the M-RoPE positions of each prompt computed on
its own tokens by `twinkle_transformers.vision.mrope_position_ids` -- the function the training forward uses, so
sampled log-probs equal `forward_only`'s. Decode steps continue from there (`step_positions`): text position p,
M-RoPE position p + delta, where delta (per row) is the prompt's largest M-RoPE position + 1 - its length (0 for
text prompts). The model's own stateful ``rope_deltas`` is never read: positions are always passed.

A VL model never samples its image/video placeholder tokens (`placeholder_token_ids`): the model swaps those for
image features, so a completion holding one could not be trained on or fed back as a prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import TOKEN_TYPE_FIELD
from twinkle_transformers.vision import is_vision_language, mrope_position_ids


@dataclass(frozen=True)
class PromptImages:
    """One prompt's images as model inputs: patches [patches, dim], grids [images, 3], 1 on image tokens."""

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    token_types: list[int]


def prompt_images(fields: Mapping[str, Any], index: int, config: Any) -> PromptImages:
    """Prompt `index`'s image fields (from `encode_prompt_row`) as tensors, checked against the model `config`:
    a vision-language model, one patch row per grid cell, as many image tokens as the grids make."""
    if not is_vision_language(config):
        raise InvalidInputError(
            f'Prompt {index} holds images but the model ({getattr(config, "model_type", "?")}) is '
            'text-only; sample image prompts from a vision-language model (e.g. Qwen3-VL).'
        )
    grid = torch.as_tensor(fields['image_grid_thw'], dtype=torch.long).view(-1, 3)
    pixels = torch.as_tensor(fields['pixel_values'], dtype=torch.float32)
    cells = int(grid.prod(-1).sum())
    if pixels.dim() != 2 or pixels.shape[0] != cells:
        raise InvalidInputError(
            f'Prompt {index}: pixel_values has shape {tuple(pixels.shape)} but image_grid_thw '
            f'{grid.tolist()} needs {cells} patch rows.'
        )
    merge = int(getattr(config.vision_config, 'spatial_merge_size', 1) or 1)
    types = list(fields[TOKEN_TYPE_FIELD])
    if sum(types) != cells // merge**2:
        raise InvalidInputError(
            f'Prompt {index} has {sum(types)} image tokens but its images make '
            f'{cells // merge**2} ({grid.tolist()}, {merge}x{merge} merge); encode it with the '
            "model's VisionTemplate."
        )
    return PromptImages(pixels, grid, types)


def placeholder_token_ids(config: Any) -> list[int]:
    """The ids a VL model replaces by image/video features (``image_token_id``, ``video_token_id``)."""
    ids = (getattr(config, name, None) for name in ('image_token_id', 'video_token_id'))
    return [int(i) for i in ids if isinstance(i, int)]


def prefill_inputs(
    model: torch.nn.Module, prompts: list[list[int]], images: list[PromptImages | None], text_positions: torch.Tensor
) -> tuple[dict[str, Any], torch.Tensor]:
    """Forward kwargs for the prefill of left-padded `prompts` (`text_positions` [B, L] from the text path) on a
    VL model, and each row's M-RoPE delta [B, 1]. Rows without images get plain text positions (delta 0)."""
    batch, width = text_positions.shape
    device = text_positions.device
    types = torch.zeros(batch, width, dtype=torch.long)
    positions = text_positions.cpu()[None].repeat(4, 1, 1)
    deltas = torch.zeros(batch, 1, dtype=torch.long)
    for row, (ids, image) in enumerate(zip(prompts, images)):
        if image is None:
            continue
        n = len(ids)
        types[row, width - n :] = torch.tensor(image.token_types)
        one = {
            'input_ids': torch.tensor([ids]),
            'position_ids': torch.arange(n)[None],
            'image_grid_thw': image.image_grid_thw,
            'image_counts': [len(image.image_grid_thw)],
            'row_lengths': [n],
        }
        mrope = mrope_position_ids(model, one, types[row : row + 1, width - n :])[1:, 0]
        positions[1:, row, width - n :] = mrope
        deltas[row] = int(mrope.max()) + 1 - n
    kwargs: dict[str, Any] = {TOKEN_TYPE_FIELD: types.to(device), 'position_ids': positions.to(device)}
    present = [image for image in images if image is not None]
    if present:
        kwargs['pixel_values'] = torch.cat([image.pixel_values for image in present]).to(device)
        kwargs['image_grid_thw'] = torch.cat([image.image_grid_thw for image in present]).to(device)
    return kwargs, deltas.to(device)


def step_positions(text_positions: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """``[4, B, 1]`` positions of a decode step: row 0 `text_positions` [B, 1], rows 1-3 text + the row's delta."""
    return torch.cat([text_positions[None], (text_positions + deltas)[None].expand(3, -1, -1)])
