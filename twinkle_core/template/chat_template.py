"""`ChatTemplate` (registered as ``Template``): encodes trajectories with any tokenizer that has a chat template."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from typing import Any, Literal, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.template import labels as L
from twinkle_core.template import tool_calls
from twinkle_core.template.base import Template
from twinkle_core.template.tokenizer import load_tokenizer
from twinkle_core.types import Trajectory

TruncationStrategy = Literal['right', 'left', 'error']
TRUNCATION_STRATEGIES: tuple[str, ...] = ('right', 'left', 'error')


class ChatTemplate(Template):
    """Trajectory -> ``{'input_ids', 'labels', **extra fields}`` using the tokenizer's own chat template.

    Labels follow docs/conventions.md: aligned with input_ids, the token id where the model is trained, -100
    elsewhere (``labels[0]`` always -100). By default assistant turns are trained on (content + end-of-turn
    token, never the role header); ``Message.loss`` overrides that per message. Trajectory fields other than
    ``messages``/``tools`` (e.g. ``ground_truth``) pass through to the encoded row.

    Args:
        model_id_or_tokenizer: a tokenizer, a local model directory, ``ms://``/``hf://`` ref or HF id.
        max_length: longest encoded row; None = no limit.
        truncation_strategy: ``'right'`` keeps the first `max_length` tokens, ``'left'`` the last ones,
            ``'error'`` raises `InvalidInputError` naming the row length and the limit.
        chat_template_kwargs: extra variables for the Jinja template (e.g. ``enable_thinking``).
    """

    def __init__(
        self,
        model_id_or_tokenizer: Any,
        max_length: int | None = None,
        truncation_strategy: TruncationStrategy = 'right',
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if truncation_strategy not in TRUNCATION_STRATEGIES:
            raise InvalidInputError(
                f'truncation_strategy must be one of {TRUNCATION_STRATEGIES}, got {truncation_strategy!r}.'
            )
        if max_length is not None and max_length < 2:
            raise InvalidInputError(f'max_length must be at least 2 (or None for no limit), got {max_length}.')
        self.tokenizer = load_tokenizer(model_id_or_tokenizer)
        if not getattr(self.tokenizer, 'chat_template', None):
            raise InvalidInputError(
                f'The tokenizer of {model_id_or_tokenizer!r} has no chat template. Set tokenizer.chat_template '
                'or use a model-specific template.'
            )
        self.max_length = max_length
        self.truncation_strategy = truncation_strategy
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.uses_generation_markers = L.has_generation_markers(self.tokenizer.chat_template)

    # ---- encoding ----------------------------------------------------------------------------------------------
    def encode(self, trajectory: Any, *, add_generation_prompt: bool = False) -> dict[str, Any]:
        """Encode one trajectory.

        ``add_generation_prompt=True`` (RL prompts): the trailing assistant turn(s) are dropped, the generation
        prompt is appended, and the row has ``input_ids`` and the prompt's ``messages`` (no labels), so that a
        sampled completion can be appended as the assistant's turn (rewards read it there). A prompt longer than
        `max_length` keeps its end (the generation prompt) under both 'left' and 'right'; 'error' raises.
        """
        from jinja2 import TemplateError

        try:
            traj = trajectory if isinstance(trajectory, Trajectory) else Trajectory.model_validate(trajectory)
        except ValueError as exc:  # pydantic.ValidationError
            raise InvalidInputError(f'Not a valid Trajectory: {exc}') from exc
        try:
            return self._encode(traj, add_generation_prompt)
        except TemplateError as exc:
            roles = [m.role for m in traj.messages]
            raise InvalidInputError(
                f'The chat template of {self.tokenizer.name_or_path!r} rejected a conversation '
                f'with roles {roles}: {exc}'
            ) from exc

    def _encode(self, traj: Trajectory, add_generation_prompt: bool) -> dict[str, Any]:
        messages = [m.model_dump(exclude_none=True, exclude={'loss'}) for m in traj.messages]
        extras = traj.model_dump(exclude={'messages', 'tools'})
        input_ids, labels = self._token_ids(traj, messages, add_generation_prompt)
        if labels is None:
            return {
                'input_ids': self._truncate(input_ids, None, keep_end=True)[0],
                'messages': prompt_messages(messages),
                **extras,
            }
        input_ids, labels = self._truncate(input_ids, labels)
        return {'input_ids': input_ids, 'labels': labels, **extras}

    def _token_ids(
        self, traj: Trajectory, messages: list[dict[str, Any]], add_generation_prompt: bool
    ) -> tuple[list[int], list[int] | None]:
        """Untruncated ``(input_ids, labels)`` of `messages` (`traj`'s, as rendered): labels from each message's
        loss flag; or, for a generation prompt, the ids without trailing assistant turns and labels None.

        Tools, tool calls and tool results go to a template that renders them itself as transformers passes them;
        any other template gets them as plain turns in the tool-call format the served model is prompted and parsed
        in (`tool_calls.plain_tool_turns`), so training and serving see the same prompt."""
        kwargs = dict(self.chat_template_kwargs)
        flags = [m.loss if m.loss is not None else m.role == 'assistant' for m in traj.messages]
        if add_generation_prompt:
            messages = prompt_messages(messages)
            flags = flags[: len(messages)]
        if tool_calls.uses_tools(messages, traj.tools) and not self.renders_tools:
            messages, sources = tool_calls.plain_tool_turns(messages, traj.tools, self.tool_format)
            flags = [any(flags[j] for j in source) for source in sources]
        else:
            messages = tool_calls.native_tool_turns(messages)
            if traj.tools:
                kwargs['tools'] = traj.tools
        if add_generation_prompt:
            return self._tokenize_prompt(messages, kwargs), None
        return self._encode_with_labels(messages, flags, kwargs)

    @functools.cached_property
    def renders_tools(self) -> bool:
        """Whether the chat template renders tools, tool calls and tool results itself (`tool_calls.renders_tools`)."""
        return tool_calls.renders_tools(self.tokenizer)

    @functools.cached_property
    def tool_format(self) -> tool_calls.ToolCallFormat:
        """The tool-call format this model is prompted and parsed in (`tool_calls.format_for` its template)."""
        return tool_calls.format_for(self.tokenizer.chat_template)

    def _tokenize_prompt(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> list[int]:
        text = L.render(self.tokenizer, messages, add_generation_prompt=True, **kwargs)
        return list(self.tokenizer(text, add_special_tokens=False)['input_ids'])

    def _encode_with_labels(
        self, messages: list[dict[str, Any]], flags: list[bool], kwargs: dict[str, Any]
    ) -> tuple[list[int], list[int]]:
        wanted = [i for i, f in enumerate(flags) if f]
        found = None
        only_assistant = all(messages[i]['role'] == 'assistant' for i in wanted)
        if self.uses_generation_markers and only_assistant:
            found = L.generation_mask_spans(self.tokenizer, messages, **kwargs)
        if found is None:
            found = L.prefix_spans(self.tokenizer, messages, wanted, **kwargs)
        input_ids, spans = found
        eos = self.tokenizer.eos_token_id
        chosen = [
            L.trim_after_eos(input_ids, spans[i], eos) if messages[i]['role'] == 'assistant' else spans[i]
            for i in wanted
        ]
        return input_ids, L.build_labels(input_ids, chosen)

    def _truncate(
        self, input_ids: list[int], labels: list[int] | None, keep_end: bool = False
    ) -> tuple[list[int], list[int] | None]:
        """Apply the truncation strategy; `keep_end` (prompts) turns 'right' into 'left' so that the generation
        prompt survives."""
        n, limit = len(input_ids), self.max_length
        if limit is None or n <= limit:
            return input_ids, labels
        if self.truncation_strategy == 'error':
            raise InvalidInputError(
                f'Encoded row has {n} tokens, more than max_length={limit}. Raise max_length, '
                'drop long rows (e.g. Dataset.filter(MessageLengthFilter(...))), or use '
                "truncation_strategy='right'/'left'."
            )
        from_left = self.truncation_strategy == 'left' or keep_end
        window = slice(n - limit, n) if from_left else slice(0, limit)
        input_ids = input_ids[window]
        if labels is not None:
            labels = labels[window]
            labels[0] = L.IGNORE_INDEX
        return input_ids, labels

    # ---- decoding ----------------------------------------------------------------------------------------------
    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def decode_completion(self, completion: Sequence[int] | dict[str, Any], *, skip_special_tokens: bool = True) -> str:
        """Text of a completion: sampled token ids (decoded as given), or an encoded row (its labelled tokens)."""
        if isinstance(completion, dict):
            completion = [t for t in completion.get('labels') or [] if t != L.IGNORE_INDEX]
        return self.decode(completion, skip_special_tokens=skip_special_tokens)

    # ---- caching -----------------------------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """Digest of the tokenizer (vocab, merges, special tokens), chat template, options and this code."""
        digest = hashlib.sha256()
        tok = self.tokenizer
        backend = getattr(tok, 'backend_tokenizer', None)
        digest.update(backend.to_str().encode() if backend is not None else repr(tok.get_vocab()).encode())
        config = {
            'chat_template': tok.chat_template,
            'eos': tok.eos_token_id,
            'max_length': self.max_length,
            'truncation': self.truncation_strategy,
            'kwargs': self.chat_template_kwargs,
            'class': f'{type(self).__module__}.{type(self).__qualname__}',
        }
        digest.update(json.dumps(config, sort_keys=True, default=repr).encode())
        for cls in type(self).__mro__:  # code changes invalidate cached encodings
            if cls.__module__.startswith(('twinkle', '__main__')) or cls is type(self):
                module = inspect.getmodule(cls)
                try:
                    digest.update(
                        inspect.getsource(module).encode() if module is not None else cls.__qualname__.encode()
                    )
                except (OSError, TypeError):
                    digest.update(cls.__qualname__.encode())
        for module in (L, tool_calls):  # what renders the rows
            digest.update(inspect.getsource(module).encode())
        return digest.hexdigest()[:32]

    def __repr__(self) -> str:
        name = getattr(self.tokenizer, 'name_or_path', '?')
        return (
            f'{type(self).__name__}({name!r}, max_length={self.max_length}, '
            f'truncation_strategy={self.truncation_strategy!r})'
        )


def prompt_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages a generation prompt renders: `messages` without its trailing assistant turn(s)."""
    prompt = list(messages)
    while prompt and prompt[-1]['role'] == 'assistant':
        prompt.pop()
    if not prompt:
        raise InvalidInputError('Cannot build a generation prompt: the trajectory has only assistant turns.')
    return prompt
