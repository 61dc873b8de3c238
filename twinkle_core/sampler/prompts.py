"""Turn `sample()` inputs into prompt token ids, per-prompt adapter names and `SamplingParams`, validating every
row, and completions into trainable rows. Shared by every sampler so they accept and return exactly the same."""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Mapping

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import IGNORE_INDEX, InputFeature, SampledSequence, SamplingParams, Trajectory

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


def as_sampling_params(params: SamplingParams | Mapping[str, Any] | None, overrides: dict[str, Any]) -> SamplingParams:
    """`params` (a SamplingParams, a dict of its fields or None) with `overrides` applied; invalid values raise
    InvalidInputError."""
    base = params.model_dump() if isinstance(params, SamplingParams) else dict(params or {})
    try:
        return SamplingParams(**{**base, **overrides})
    except Exception as exc:  # pydantic.ValidationError -> the user's mistake, said plainly
        raise InvalidInputError(f'Invalid sampling parameters: {exc}') from exc


def adapters_per_prompt(adapter_name: str | list[str | None] | None, rows: list[Any]) -> list[str | None]:
    """One adapter name (None = base weights) per prompt: from `adapter_name` (one name, or one per prompt) or
    else from each row's own `adapter_name` field."""
    if isinstance(adapter_name, (list, tuple)):
        if len(adapter_name) != len(rows):
            raise InvalidInputError(f'adapter_name has {len(adapter_name)} entries for {len(rows)} prompts; '
                                    'give one per prompt (None for the base model).')
        return list(adapter_name)
    if adapter_name is not None:
        return [adapter_name] * len(rows)
    return [row_adapter(row) for row in rows]


def sequence_seed(base_seed: int, sample_index: int) -> int:
    """Seed of sample `sample_index` of a request seeded `base_seed` (well mixed, 63 bits): each sample has its own
    random stream, so a seeded sample is reproducible whatever else is batched with it."""
    digest = hashlib.blake2b(f'{base_seed}:{sample_index}'.encode(), digest_size=8).digest()
    return int.from_bytes(digest, 'little') >> 1


#: per-token fields of a prompt row, which do not carry over to its completion's trainable row
TOKEN_FIELDS = frozenset({'input_ids', 'labels', 'attention_mask', 'position_ids', 'weights', 'old_logps',
                          'ref_logps', 'advantages', 'advantage'})


def completion_feature(row: Any, prompt: list[int], tokens: list[int], text: str | None) -> dict[str, Any]:
    """The trainable row of a sampled completion: the prompt row's other fields (e.g. ``ground_truth``),
    ``input_ids`` = prompt + completion, ``labels`` the same with the prompt masked (``IGNORE_INDEX``) and, when
    the row has ``messages``, the completion `text` appended as the assistant's message."""
    if isinstance(row, (InputFeature, Trajectory)):
        row = row.model_dump(exclude_none=True)
    fields = {k: v for k, v in row.items() if k not in TOKEN_FIELDS} if isinstance(row, dict) else {}
    if isinstance(fields.get('messages'), list):
        fields['messages'] = [*fields['messages'], {'role': 'assistant', 'content': text or ''}]
    return {**fields, 'input_ids': list(prompt) + list(tokens), 'labels': [IGNORE_INDEX] * len(prompt) + list(tokens)}


def sampled_sequence(params: SamplingParams, row: Any, prompt: list[int], tokens: list[int], logprobs: list[float],
                     top: list[list[tuple[int, float]]] | None, stop_reason: str,
                     text: str | None) -> SampledSequence:
    """One sample as every sampler returns it. `logprobs`: the sampled tokens' log-probs; `top`: per step the
    `params.alternatives` most likely (token, log-prob), most likely first (None when none were asked for)."""
    if params.logprob_pairs is not None:
        k = params.logprob_pairs
        shaped: Any = [[(t, lp)] + [pair for pair in (step or [])[:k] if pair[0] != t]
                       for t, lp, step in zip(tokens, logprobs, top or [[]] * len(tokens))]
    else:
        shaped = logprobs if params.logprobs else None
    return SampledSequence(tokens=tokens, logprobs=shaped, stop_reason=stop_reason, text=text,
                           top_logprobs=[step[:params.top_logprobs] for step in top] if params.top_logprobs and top
                           else None,
                           new_input_feature=completion_feature(row, prompt, tokens, text))
