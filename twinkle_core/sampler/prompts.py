"""Turn `sample()` inputs into prompt token ids (plus image inputs), per-prompt adapter names and `SamplingParams`,
validating every row, and completions into trainable rows. Shared by every sampler so they accept and return
exactly the same.

Image prompts: a Trajectory with images (encoded by a vision template) or an encoded row carrying
``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` (`IMAGE_FIELDS`). `encode_prompt_row` keeps those
fields next to the ids; `completion_feature` carries them into the trainable row of each completion.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Hashable, Mapping, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import (
    IGNORE_INDEX,
    IMAGE_ROW_FIELDS,
    TOKEN_TYPE_FIELD,
    InputFeature,
    SampledSequence,
    SamplingParams,
    StopReason,
    Trajectory,
    as_list,
)

#: What a chat encoder returns for a Trajectory: its prompt ids, or an encoded row (``input_ids`` + image fields).
EncodeChat = Callable[[Trajectory], 'list[int] | Mapping[str, Any]']
#: Fields of an encoded image prompt that belong with its ids: the images' patches, grids and token types.
IMAGE_FIELDS = (*IMAGE_ROW_FIELDS, TOKEN_TYPE_FIELD)


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
    raise InvalidInputError(
        f'sample() expects InputFeature dicts, Trajectories or token-id lists, got {type(inputs).__name__}.'
    )


def encode_prompt_row(row: Any, index: int, encode_chat: EncodeChat | None) -> dict[str, Any]:
    """Prompt `index` as ``{'input_ids': [...]}`` plus, for an image prompt, its `IMAGE_FIELDS` (validated: all
    three present, ``mm_token_type_ids`` one per token). Trajectories are encoded with `encode_chat` (the
    template; generation prompt added)."""
    if isinstance(row, InputFeature):
        row = row.model_dump(exclude_none=True)
    if isinstance(row, dict) and 'messages' in row and 'input_ids' not in row:
        try:
            row = Trajectory.model_validate(row)
        except Exception as exc:
            raise InvalidInputError(f'Prompt {index} is not a valid Trajectory: {exc}') from exc
    if isinstance(row, Trajectory):
        if encode_chat is None:
            raise InvalidInputError(
                f'Prompt {index} is a Trajectory but the sampler has no template or tokenizer; '
                'call `sampler.set_template(...)` or pass input_ids.'
            )
        encoded = encode_chat(row)
        row = dict(encoded) if isinstance(encoded, Mapping) else {'input_ids': encoded}
    if isinstance(row, dict):
        ids = row.get('input_ids')
        ids = ids.tolist() if ids is not None and hasattr(ids, 'tolist') else ids
    elif isinstance(row, (list, tuple)):
        ids = list(row)
    else:
        raise InvalidInputError(
            f'Prompt {index} is a {type(row).__name__}; expected an InputFeature dict '
            '(input_ids), a Trajectory (messages) or a list of token ids.'
        )
    if not isinstance(ids, (list, tuple)) or not ids:
        raise InvalidInputError(f'Prompt {index} is empty; every prompt needs at least one token.')
    if not all(isinstance(t, int) for t in ids):
        raise InvalidInputError(f'Prompt {index}: input_ids must be integers.')
    return {'input_ids': list(ids), **(_image_fields(row, len(ids), index) if isinstance(row, dict) else {})}


def _image_fields(row: dict[str, Any], num_tokens: int, index: int) -> dict[str, Any]:
    present = [name for name in IMAGE_FIELDS if row.get(name) is not None]
    if not present:
        return {}
    missing = [name for name in IMAGE_FIELDS if name not in present]
    if missing:
        raise InvalidInputError(
            f'Prompt {index} has {present} but not {missing}: an image prompt needs '
            f'{list(IMAGE_FIELDS)} together (encode it with a VisionTemplate).'
        )
    types = [int(t) for t in as_list(row[TOKEN_TYPE_FIELD])]
    if len(types) != num_tokens:
        raise InvalidInputError(
            f'Prompt {index}: {TOKEN_TYPE_FIELD} has {len(types)} values for {num_tokens} '
            'tokens; it needs one per token (1 on image tokens).'
        )
    return {'pixel_values': row['pixel_values'], 'image_grid_thw': row['image_grid_thw'], TOKEN_TYPE_FIELD: types}


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
            raise InvalidInputError(
                f'adapter_name has {len(adapter_name)} entries for {len(rows)} prompts; '
                'give one per prompt (None for the base model).'
            )
        return list(adapter_name)
    if adapter_name is not None:
        return [adapter_name] * len(rows)
    return [row_adapter(row) for row in rows]


def check_prompt_scoring(
    sampler: str, capabilities: Any, prompts: list[list[int]], params: SamplingParams, vocab: int | None = None
) -> None:
    """Refuse (InvalidInputError) what `params` asks of the prompts that the sampler does not declare in
    `capabilities` (a `SamplerCapabilities`; `sampler`: its name, for the message) or that does not fit a prompt:
    top-k alternatives above ``max_top_logprobs``, a `prompt_logprobs_last_n` beyond a prompt, target ids whose rows
    do not match a prompt's positions or lie outside the vocabulary."""
    caps = capabilities
    asked = {
        'prompt_logprobs (log-probs of the prompt tokens)': params.prompt_logprobs and not caps.prompt_logprobs,
        'prompt_top_logprobs (top-k log-probs at prompt positions)': bool(params.prompt_top_logprobs)
        and not caps.prompt_top_logprobs,
        'prompt_target_tokens (log-probs of chosen token ids at prompt positions)': params.prompt_target_tokens
        is not None
        and not caps.prompt_target_logprobs,
        'prompt_alt_tokens (tokens drawn at prompt positions)': bool(params.prompt_alt_tokens)
        and not caps.prompt_alt_tokens,
    }
    for name, refused in asked.items():
        if refused:
            raise InvalidInputError(f'{sampler} does not support {name}; sample without it or use another sampler.')
    widest = max(params.alternatives, params.prompt_top_logprobs)
    if widest and caps.max_top_logprobs is not None and widest > caps.max_top_logprobs:
        what = 'prompt_top_logprobs' if params.prompt_top_logprobs == widest else 'top_logprobs'
        raise InvalidInputError(
            f'{what}={widest} (top-k log-probs per position) is above the {caps.max_top_logprobs} most likely '
            f'tokens per position {sampler} returns; ask for fewer.'
        )
    targets = params.prompt_target_tokens
    for i, ids in enumerate(prompts):
        last_n = params.prompt_logprobs_last_n
        if last_n is not None and last_n > len(ids) - 1:
            raise InvalidInputError(
                f'Prompt {i}: prompt_logprobs_last_n={last_n} is more than its {len(ids) - 1} scorable tokens '
                f'(len(prompt) - 1; position 0 has no logprob).'
            )
        if targets is not None and len(targets) != len(ids) - 1:
            raise InvalidInputError(
                f'Prompt {i}: prompt_target_tokens has {len(targets)} rows but the prompt has {len(ids)} tokens; '
                f'it needs len(prompt) - 1 = {len(ids) - 1} rows (row i scores position i + 1).'
            )
        if params.prompt_alt_tokens and len(ids) < 2:
            raise InvalidInputError(f'Prompt {i}: prompt_alt_tokens needs a prompt of at least 2 tokens.')
    if targets is not None and vocab is not None:
        top = max(t for row in targets for t in row)
        if top >= vocab:
            raise InvalidInputError(f'prompt_target_tokens holds id {top}, outside the vocabulary [0, {vocab}).')


def first_scored(prompt_length: int, last_n: int | None) -> int:
    """The first prompt position whose log-probs are returned: 1 (position 0 has none), or the first of the last
    `last_n` positions."""
    return 1 if last_n is None else max(1, prompt_length - last_n)


def prompt_occurrences(prompts: Sequence[Sequence[int]], adapters: Sequence[str | None]) -> list[int]:
    """Per prompt, how many identical prompts (the same token ids for the same adapter, `adapters[i]` being prompt
    i's) come before it in the same call: 0 for the first, 1 for its first duplicate, ... -- what `sequence_seed`
    mixes in so that duplicates draw apart. One prompt under two adapters is two requests, not a duplicate: it
    keeps one stream (the adapters' samples stay comparable)."""
    return _occurrences([(adapter, tuple(prompt)) for prompt, adapter in zip(prompts, adapters, strict=True)])


def resolve_occurrences(
    occurrences: Sequence[int] | None, prompts: Sequence[Sequence[int]], adapters: Sequence[str | None]
) -> list[int]:
    """The occurrence of each prompt of a `sample` call (see `Sampler.sample`): the caller's `occurrences` (computed
    over the whole logical call this call is a part of), validated, or else `prompt_occurrences` of this call."""
    if occurrences is None:
        return prompt_occurrences(prompts, adapters)
    given = list(occurrences)
    if len(given) != len(prompts):
        raise InvalidInputError(
            f'occurrences has {len(given)} entries for {len(prompts)} prompts; give one per prompt (its index among '
            'identical prompts of the whole call) or None to count them in this call.'
        )
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in given):
        raise InvalidInputError(f'occurrences must be non-negative integers, got {given}.')
    return given


def call_occurrences(inputs: Any, adapter_name: str | list[str | None] | None) -> list[int]:
    """`prompt_occurrences` over the raw `inputs` and `adapter_name` of a `sample` call, before any sampler encodes
    them: for a caller that splits one call's prompts over several samplers (each passes its part as
    ``occurrences=``). Encoded prompts (token ids) compare exactly as a sampler compares them; a Trajectory is
    compared by what a template encodes of it (its ``messages`` and ``tools``), not by its other fields (e.g. a
    ``ground_truth``). A row that is not a valid prompt counts as distinct (its sampler reports it)."""
    rows = prompt_rows(inputs)
    adapters = adapters_per_prompt(adapter_name, rows)
    return _occurrences([(adapter, _prompt_key(row, i)) for i, (row, adapter) in enumerate(zip(rows, adapters))])


def split_call_kwargs(inputs: Any, kwargs: dict[str, Any]) -> dict[str, list[Any]]:
    """The per-prompt keywords of a `Sampler.sample` call that is split across data ranks (`RemoteSpec.row_kwargs`):
    ``occurrences`` over the whole call (the caller's, or `call_occurrences`) and a per-prompt ``adapter_name``
    list, each rank getting its prompts' entries."""
    adapter_name, given = kwargs.get('adapter_name'), kwargs.get('occurrences')
    out: dict[str, list[Any]] = {
        'occurrences': list(given) if given is not None else call_occurrences(inputs, adapter_name)
    }
    if isinstance(adapter_name, (list, tuple)):
        out['adapter_name'] = list(adapter_name)
    return out


def _prompt_key(row: Any, index: int) -> tuple[Any, ...]:
    """What identifies `row` as a prompt before encoding: its token ids, or a Trajectory's messages and tools."""
    if isinstance(row, InputFeature):
        row = row.model_dump(exclude_none=True)
    if isinstance(row, (list, tuple)) and all(isinstance(t, int) for t in row):
        return ('ids', *row)
    if isinstance(row, dict) and row.get('input_ids') is not None:
        ids = row['input_ids']
        ids = ids.tolist() if hasattr(ids, 'tolist') else ids
        if isinstance(ids, (list, tuple)) and all(isinstance(t, int) for t in ids):
            return ('ids', *ids)
    try:
        chat = Trajectory.model_validate(row).model_dump(mode='json', exclude_none=True)
    except Exception:  # noqa: BLE001 - not a prompt: its sampler says what is wrong with it
        return ('invalid', index)
    return ('chat', json.dumps({'messages': chat['messages'], 'tools': chat.get('tools')}, sort_keys=True))


def _occurrences(keys: Sequence[Hashable]) -> list[int]:
    """Per key, how many equal keys come before it."""
    seen: dict[Hashable, int] = {}
    out = []
    for key in keys:
        out.append(seen.get(key, 0))
        seen[key] = out[-1] + 1
    return out


def prompt_draw_seed(base_seed: int, prompt: Sequence[int], occurrence: int = 0) -> int:
    """Seed of the `prompt_alt_tokens` draws of `prompt` in a request seeded `base_seed` (a stream of its own,
    distinct from every sample's)."""
    return sequence_seed(base_seed, -1, prompt, occurrence)


def sequence_seed(base_seed: int, sample_index: int, prompt: Sequence[int], occurrence: int = 0) -> int:
    """Seed of sample `sample_index` of `prompt` (its token ids) in a request seeded `base_seed` (well mixed, 63
    bits); `occurrence`: the prompt's index among identical prompts of the same call (`prompt_occurrences`).

    Each sample of each prompt has its own random stream: a seeded sample is reproducible whatever other
    (distinct) prompts are batched with it and wherever its prompt stands in the batch, and different prompts of
    one seeded call draw independently (one stream shared by every prompt would make their s-th samples move in
    lockstep). Identical prompts in one call are told apart by their occurrence (a GRPO group sent as G copies of
    one prompt, one sample each, gets G different completions); the first occurrence keeps the stream it has
    alone."""
    h = hashlib.blake2b(f'{base_seed}:{sample_index}:'.encode(), digest_size=8)
    if occurrence:  # '#' never occurs in the token list below: no collision with another prompt's stream
        h.update(f'#{occurrence}#'.encode())
    h.update(b','.join(str(t).encode() for t in prompt))
    return int.from_bytes(h.digest(), 'little') >> 1


#: per-token fields of a prompt row, which do not carry over to its completion's trainable row
TOKEN_FIELDS = frozenset(
    {
        'input_ids',
        'labels',
        'attention_mask',
        'position_ids',
        'weights',
        'old_logps',
        'ref_logps',
        'advantages',
        'advantage',
        TOKEN_TYPE_FIELD,
    }
)


def completion_feature(
    row: Any, prompt: list[int], tokens: list[int], text: str | None, images: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The trainable row of a sampled completion: the prompt row's other fields (e.g. ``ground_truth``),
    ``input_ids`` = prompt + completion, ``labels`` the same with the prompt masked (``IGNORE_INDEX``) and, when
    the row has ``messages``, the completion `text` appended as the assistant's message. `images`: the prompt's
    `IMAGE_FIELDS` (from `encode_prompt_row`), carried over with ``mm_token_type_ids`` extended by zeros."""
    if isinstance(row, (InputFeature, Trajectory)):
        row = row.model_dump(exclude_none=True)
    fields = {k: v for k, v in row.items() if k not in TOKEN_FIELDS} if isinstance(row, dict) else {}
    if isinstance(fields.get('messages'), list):
        fields['messages'] = [*fields['messages'], {'role': 'assistant', 'content': text or ''}]
    if images:
        fields.update(pixel_values=images['pixel_values'], image_grid_thw=images['image_grid_thw'])
        fields[TOKEN_TYPE_FIELD] = list(images[TOKEN_TYPE_FIELD]) + [0] * len(tokens)
    return {**fields, 'input_ids': list(prompt) + list(tokens), 'labels': [IGNORE_INDEX] * len(prompt) + list(tokens)}


def sampled_sequence(
    params: SamplingParams,
    row: Any,
    prompt: list[int],
    tokens: list[int],
    logprobs: list[float],
    top: list[list[tuple[int, float]]] | None,
    stop_reason: StopReason,
    text: str | None,
    images: Mapping[str, Any] | None = None,
) -> SampledSequence:
    """One sample as every sampler returns it. `logprobs`: the sampled tokens' log-probs; `top`: per step the
    `params.alternatives` most likely (token, log-prob), most likely first (None when none were asked for);
    `images`: the prompt's image fields (see `completion_feature`)."""
    if params.logprob_pairs is not None:
        k = params.logprob_pairs
        shaped: Any = [
            [(t, lp)] + [pair for pair in (step or [])[:k] if pair[0] != t]
            for t, lp, step in zip(tokens, logprobs, top or [[]] * len(tokens))
        ]
    else:
        shaped = logprobs if params.logprobs else None
    return SampledSequence(
        tokens=tokens,
        logprobs=shaped,
        stop_reason=stop_reason,
        text=text,
        top_logprobs=[step[: params.top_logprobs] for step in top] if params.top_logprobs and top else None,
        new_input_feature=completion_feature(row, prompt, tokens, text, images),
    )
