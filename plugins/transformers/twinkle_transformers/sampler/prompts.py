"""Turn `sample()` inputs into prompt token ids (and per-prompt adapter names), validating every row."""
from __future__ import annotations

from typing import Any, Callable

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import InputFeature, Trajectory

EncodeChat = Callable[[Trajectory], list[int]]


def prompt_rows(inputs: Any) -> list[Any]:
    """One entry per prompt. A single prompt (dict, InputFeature, Trajectory, or a flat list of token ids) is
    wrapped in a list."""
    if isinstance(inputs, (dict, InputFeature, Trajectory)):
        return [inputs]
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise InvalidInputError('sample() got no prompts; pass a list of InputFeature dicts or Trajectories.')
        if isinstance(inputs[0], int):
            return [list(inputs)]
        return list(inputs)
    raise InvalidInputError(f'sample() expects InputFeature dicts, Trajectories or token-id lists, got '
                            f'{type(inputs).__name__}.')


def encode_prompt(row: Any, index: int, encode_chat: EncodeChat | None) -> list[int]:
    """Token ids of prompt `index`. Trajectories are encoded with the chat template (generation prompt added)."""
    if isinstance(row, InputFeature):
        row = row.model_dump(exclude_none=True)
    if isinstance(row, dict) and 'messages' in row and 'input_ids' not in row:
        try:
            row = Trajectory.model_validate(row)
        except Exception as exc:
            raise InvalidInputError(f'Prompt {index} is not a valid Trajectory: {exc}') from exc
    if isinstance(row, Trajectory):
        if encode_chat is None:
            raise InvalidInputError(f'Prompt {index} is a Trajectory but the sampler has no template or tokenizer; '
                                    'call `sampler.set_template(...)` or pass input_ids.')
        ids = encode_chat(row)
    elif isinstance(row, dict):
        ids = row.get('input_ids')
        ids = ids.tolist() if hasattr(ids, 'tolist') else ids
    elif isinstance(row, (list, tuple)):
        ids = list(row)
    else:
        raise InvalidInputError(f'Prompt {index} is a {type(row).__name__}; expected an InputFeature dict '
                                '(input_ids), a Trajectory (messages) or a list of token ids.')
    if not isinstance(ids, (list, tuple)) or not ids:
        raise InvalidInputError(f'Prompt {index} is empty; every prompt needs at least one token.')
    if not all(isinstance(t, int) for t in ids):
        raise InvalidInputError(f'Prompt {index}: input_ids must be integers.')
    return list(ids)


def row_adapter(row: Any) -> str | None:
    """The per-row `adapter_name` field of an InputFeature/Trajectory row, if any."""
    if isinstance(row, dict):
        return row.get('adapter_name')
    return getattr(row, 'adapter_name', None) if isinstance(row, (InputFeature, Trajectory)) else None
