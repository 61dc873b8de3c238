"""Chat messages (OpenAI's shape) -> the prompt a model samples from, rendered by the model's own chat template.

Tools: a template that renders tools, assistant tool calls and tool results itself (found by rendering a probe
conversation once: `ChatRenderer.native_tools`) gets them as transformers passes them (``tools=`` and the messages'
``tool_calls`` / ``tool`` role). Any other template gets plain turns carrying the tool-call format's text
(`tool_parsers.ToolCallFormat`): the tool list in the system message, calls in the assistant's text, results in a
user turn. `tool_choice`: ``none`` renders no tools (and nothing is parsed), ``auto`` renders them, ``required`` and
a named function also write the start of a call after the generation prompt (`RenderedChat.prefill`), so the model
continues a call.
"""

from __future__ import annotations

import inspect
import json
import threading
from dataclasses import dataclass
from typing import Any

from twinkle_server.api.openai.errors import invalid
from twinkle_server.api.openai.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice
from twinkle_server.api.openai.tool_parsers import ParsedCall, ToolCallFormat, format_for

PROBE_TOOL, PROBE_CALL, PROBE_RESULT = 'twinkle_probe_tool', 'twinkle_probe_call', 'twinkle_probe_result'


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
                self._native = self._probe()
            return self._native

    def _probe(self) -> bool:
        call = {'type': 'function', 'id': 'call_0', 'function': {'name': PROBE_CALL, 'arguments': {}}}
        messages: list[dict[str, Any]] = [
            {'role': 'user', 'content': 'hi'},
            {'role': 'assistant', 'content': '', 'tool_calls': [call]},
            {'role': 'tool', 'content': PROBE_RESULT, 'tool_call_id': 'call_0'},
        ]
        tool = {'type': 'function', 'function': {'name': PROBE_TOOL, 'parameters': {'type': 'object'}}}
        try:
            text = self._apply(messages, [tool], {})
        except Exception:  # noqa: BLE001 - a template that fails on tools does not support them
            return False
        return all(marker in text for marker in (PROBE_TOOL, PROBE_CALL, PROBE_RESULT))

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
        if self.native_tools:
            messages, listed = [_native_message(m, i) for i, m in enumerate(req.messages)], tools
        else:
            messages, listed = _plain_messages(req.messages, tools, fmt), []
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


def _calls(message: ChatMessage) -> list[ParsedCall]:
    return [ParsedCall(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def _native_message(message: ChatMessage, index: int) -> dict[str, Any]:
    """A message as transformers' chat templates take it (arguments as objects where they are JSON)."""
    role = 'system' if message.role == 'developer' else message.role
    out: dict[str, Any] = {'role': role, 'content': message_text(message, index)}
    if message.tool_calls:
        out['tool_calls'] = [
            {'type': 'function', 'id': c.id, 'function': {'name': c.function.name, 'arguments': _arguments(c)}}
            for c in message.tool_calls
        ]
    if message.role == 'tool':
        out['tool_call_id'] = message.tool_call_id or ''
    if message.name:
        out['name'] = message.name
    return out


def _arguments(call: Any) -> Any:
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments


def _plain_messages(messages: list[ChatMessage], tools: list[dict[str, Any]], fmt: ToolCallFormat) -> list[dict]:
    """System / user / assistant turns only: tools in the system message, calls and results as `fmt`'s text."""
    out: list[dict[str, Any]] = []
    results: list[str] = []
    for i, m in enumerate(messages):
        if m.role == 'tool':
            results.append(message_text(m, i))
            continue
        if results:
            out.append({'role': 'user', 'content': fmt.render_results(results)})
            results = []
        text = message_text(m, i)
        if m.role == 'assistant' and m.tool_calls:
            text = fmt.render_calls(text, _calls(m))
        out.append({'role': 'system' if m.role == 'developer' else m.role, 'content': text})
    if results:
        out.append({'role': 'user', 'content': fmt.render_results(results)})
    if tools:
        described = fmt.system_prompt(tools)
        if out and out[0]['role'] == 'system':
            out[0] = {'role': 'system', 'content': f'{out[0]["content"]}\n\n{described}'}
        else:
            out.insert(0, {'role': 'system', 'content': described})
    return out
