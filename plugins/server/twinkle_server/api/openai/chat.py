"""Chat messages (OpenAI's shape) -> the prompt a model samples from, rendered by the model's own chat template.

Tools: a template that renders tools, assistant tool calls and tool results itself (found by rendering a probe
conversation once: `ChatRenderer.native_tools`) gets them as transformers passes them (``tools=`` and the messages'
``tool_calls`` / ``tool`` role). Any other template gets plain turns carrying the tool-call format's text
(`twinkle_core.template.tool_calls`, shared with the training-side `ChatTemplate`): the tool list in the system
message, calls in the assistant's text, results in a user turn. `tool_choice`: ``none`` renders no tools (and
nothing is parsed), ``auto`` renders them, ``required`` and a named function also write the start of a call after
the generation prompt (`RenderedChat.prefill`), so the model continues a call.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import Any

from twinkle_core.template.tool_calls import (
    ToolCallFormat,
    format_for,
    native_tool_turns,
    plain_tool_turns,
    renders_tools,
)
from twinkle_server.api.openai.errors import invalid
from twinkle_server.api.openai.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice


@dataclass(frozen=True)
class RenderedChat:
    """`text`: the prompt (with `prefill` at its end); `tool_format`: set when the output is parsed for calls."""

    text: str
    prefill: str = ''
    tool_format: ToolCallFormat | None = None
    parallel_tool_calls: bool = True


class ChatRenderer:
    """Renders conversations with one tokenizer's chat template (thread-safe; built once per served model)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        template = getattr(tokenizer, 'chat_template', None)
        if isinstance(template, dict):  # several named templates
            template = '\n'.join(str(t) for t in template.values())
        self.template: str | None = template or None
        self.tool_format = format_for(self.template)
        self._native: bool | None = None
        self._lock = threading.Lock()
        self.reserved = set(inspect.signature(tokenizer.apply_chat_template).parameters) | {'messages', 'tools'}

    @property
    def native_tools(self) -> bool:
        """Whether the template renders tool definitions, assistant tool calls and tool results itself."""
        with self._lock:
            if self._native is None:
                self._native = renders_tools(self.tokenizer)
            return self._native

    def render(self, req: ChatCompletionRequest) -> RenderedChat:
        """The prompt of `req` (its messages, tools and tool_choice); a 400 for what cannot be rendered."""
        if self.template is None:
            raise invalid(
                'this model has no chat template; send the prompt text to /v1/completions instead', param='model'
            )
        kwargs = dict(req.chat_template_kwargs or {})
        clash = sorted(k for k in kwargs if k in self.reserved)
        if clash:
            raise invalid(f'chat_template_kwargs may not set {clash}', param='chat_template_kwargs')
        choice = req.tool_choice
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []] if choice != 'none' else []
        if choice not in (None, 'none', 'auto') and not tools:
            raise invalid('tool_choice names a tool call but no tools are given', param='tool_choice')
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {t['function']['name'] for t in tools}:
            raise invalid(f'tool_choice names {choice.function.name!r}, which is not in tools', param='tool_choice')
        fmt = self.tool_format
        given = [_message_dict(m, i) for i, m in enumerate(req.messages)]
        if self.native_tools:
            messages, listed = native_tool_turns(given), tools
        else:
            messages, listed = plain_tool_turns(given, tools, fmt)[0], []
        text = self._render(messages, listed, kwargs)
        prefill = ''
        if choice == 'required' or isinstance(choice, NamedToolChoice):
            prefill = fmt.forced_prefix(choice.function.name if isinstance(choice, NamedToolChoice) else None)
        return RenderedChat(
            text + prefill,
            prefill,
            fmt if tools else None,
            parallel_tool_calls=req.parallel_tool_calls is not False,
        )

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
        from jinja2 import TemplateError

        try:
            return self._apply(messages, tools, kwargs)
        except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            roles = [m['role'] for m in messages]
            raise invalid(
                f'the chat template of this model rejected a conversation with roles {roles}: '
                f'{type(exc).__name__}: {exc}',
                param='messages',
            ) from None

    def _apply(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=False, **kwargs
        )


def message_text(message: ChatMessage, index: int) -> str:
    """A message's content as text: a string, or its text parts joined by newlines (other parts: a 400)."""
    content = message.content
    if content is None:
        return ''
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.get('type') != 'text' or not isinstance(part.get('text'), str):
            raise invalid(
                f'messages[{index}].content[{j}]: only text parts ({{"type": "text", "text": ...}}) are supported '
                f'on this endpoint, got type {part.get("type")!r}',
                param=f'messages.[{index}].content',
            )
        texts.append(part['text'])
    return '\n'.join(texts)


def _message_dict(message: ChatMessage, index: int) -> dict[str, Any]:
    """A message as transformers' chat templates take it, its calls' arguments as the JSON text sent."""
    role = 'system' if message.role == 'developer' else message.role
    out: dict[str, Any] = {'role': role, 'content': message_text(message, index)}
    if message.tool_calls:
        out['tool_calls'] = [
            {'type': 'function', 'id': c.id, 'function': {'name': c.function.name, 'arguments': c.function.arguments}}
            for c in message.tool_calls
        ]
    if message.role == 'tool':
        out['tool_call_id'] = message.tool_call_id or ''
    if message.name:
        out['name'] = message.name
    return out
