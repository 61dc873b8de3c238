"""Which tokens of a rendered conversation carry loss.

Two ways to find each message's tokens, both exact:

1. `generation_mask_spans`: the chat template has ``{% generation %}`` markers, so the tokenizer returns an
   assistant mask; its runs of ones map, in order, to the assistant messages.
2. `prefix_spans`: render ``messages[:i]`` and ``messages[:i+1]`` as text; message ``i`` is the text between them
   (for an assistant message the first rendering ends with the generation prompt, so the role header is excluded).
   Templates that render a turn differently once later turns follow (Qwen3 adds an empty ``<think>`` block to the
   final answer only) break this for earlier turns; there the turn is located in the full text instead: from the
   end of its generation prompt to the end of its (visible) content plus the EOS token.
   The full conversation is tokenized once and tokens are assigned by character offsets. Everything a template
   renders after the EOS token of an assistant turn (a newline separator) carries no loss.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import IGNORE_INDEX

_GENERATION_TAG = re.compile(r'\{%-?\s*generation\s*-?%\}')


def has_generation_markers(chat_template: str | None) -> bool:
    """True when the Jinja chat template marks assistant output with ``{% generation %}`` blocks."""
    return chat_template is not None and _GENERATION_TAG.search(chat_template) is not None


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[0,1,1,0,1] -> [(1, 3), (4, 5)]``: half-open index ranges of consecutive ones."""
    runs, start = [], None
    for i, bit in enumerate(mask):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(mask)))
    return runs


def render(
    tokenizer: Any, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False, **kwargs: Any
) -> str:
    if not messages:
        return ''
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


def generation_mask_spans(
    tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any
) -> tuple[list[int], dict[int, tuple[int, int]]] | None:
    """Token ids and ``{message index: token span}`` for assistant messages, from the template's generation mask.

    None when the mask's runs do not map one-to-one onto the assistant messages (then use `prefix_spans`).
    """
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kwargs
    )
    input_ids, mask = list(out['input_ids']), list(out['assistant_masks'])
    assistant = [i for i, m in enumerate(messages) if m['role'] == 'assistant']
    runs = mask_runs(mask)
    if len(runs) != len(assistant):
        return None
    return input_ids, dict(zip(assistant, runs))


def prefix_spans(
    tokenizer: Any, messages: list[dict[str, Any]], wanted: Sequence[int], **kwargs: Any
) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Token ids of the full conversation and ``{message index: token span}`` for each index in `wanted`."""
    full = render(tokenizer, messages, **kwargs)
    eos_text = tokenizer.eos_token or ''
    char_spans: dict[int, tuple[int, int]] = {}
    for i in wanted:
        is_assistant = messages[i]['role'] == 'assistant'
        before = render(tokenizer, messages[:i], add_generation_prompt=is_assistant, **kwargs)
        upto = render(tokenizer, messages[: i + 1], **kwargs)
        if upto.startswith(before) and full.startswith(upto):
            char_spans[i] = (len(before), len(upto))
        else:
            char_spans[i] = _locate_in_full(full, before, messages[i], i, eos_text)
    if not getattr(tokenizer, 'is_fast', False):
        raise InvalidInputError(
            f'{type(tokenizer).__name__} is a slow tokenizer; finding assistant tokens without '
            '{% generation %} markers needs character offsets (use a fast tokenizer).'
        )
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc['input_ids']), enc['offset_mapping']
    token_spans: dict[int, tuple[int, int]] = {}
    for i, (c0, c1) in char_spans.items():
        inside = [t for t, (s, _) in enumerate(offsets) if c0 <= s < c1]
        token_spans[i] = (inside[0], inside[-1] + 1) if inside else (0, 0)
    return ids, token_spans


def _locate_in_full(full: str, before: str, message: dict[str, Any], index: int, eos_text: str) -> tuple[int, int]:
    """Character span of a turn the template renders differently as history: from where its prompt ends to the
    end of its content (as rendered: verbatim, stripped, or without a ``<think>`` block) plus a following EOS."""
    start = len(before) if full.startswith(before) else len(_common_prefix(full, before))
    content = str(message.get('content') or '')
    candidates = [content, content.strip(), content.split('</think>')[-1].lstrip('\n')]
    for text in candidates:
        at = full.find(text, start) if text else -1
        if at >= 0:
            end = at + len(text)
            if eos_text and full.startswith(eos_text, end):
                end += len(eos_text)
            return start, end
    raise InvalidInputError(
        f'Cannot locate message {index} ({message["role"]}) in the rendered conversation: the chat template does '
        'not render its content verbatim. Use a chat template with {% generation %} markers or a model-specific '
        'Template.'
    )


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]


def trim_after_eos(input_ids: Sequence[int], span: tuple[int, int], eos_token_id: int | None) -> tuple[int, int]:
    """End an assistant span at its last EOS token (separators rendered after it are not trained on)."""
    start, end = span
    if eos_token_id is None:
        return span
    for t in range(end - 1, start - 1, -1):
        if input_ids[t] == eos_token_id:
            return start, t + 1
    return span


def build_labels(input_ids: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[int]:
    """Labels aligned with input_ids: the token itself inside `spans`, -100 elsewhere; ``labels[0]`` is -100."""
    labels = [IGNORE_INDEX] * len(input_ids)
    for start, end in spans:
        labels[start:end] = input_ids[start:end]
    if labels:
        labels[0] = IGNORE_INDEX
    return labels
