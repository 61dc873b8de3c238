"""Tool-call formats: how a model family writes tool calls in its output, and how to render tools, calls and results
for a chat template that cannot render them itself.

A format is chosen by the chat template that names its markers (`format_for`); a template that names none gets
`FALLBACK` (``hermes``), which is also the format `chat.render` writes into the prompt of a template without tool
support, so the model is always told the format it is parsed in. Add a family by subclassing `ToolCallFormat` and
calling `register`.

``hermes`` (Qwen2.5, Qwen3, Hermes, and the fallback) writes each call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; results go back in a user turn as
``<tool_response>\\n...\\n</tool_response>`` blocks; the tool list is described in the system message, in Qwen's words.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON text, as OpenAI sends it


@dataclass(frozen=True)
class ParsedOutput:
    """A completion split into the text around the calls (None when only whitespace) and the calls."""

    content: str | None
    calls: list[ParsedCall] = field(default_factory=list)


class ToolCallFormat(ABC):
    """One family's tool-call syntax. `parse` returns None for output that holds no (well-formed) call: the whole
    text is then the answer's content."""

    name: ClassVar[str]

    @abstractmethod
    def detect(self, chat_template: str) -> bool:
        """Whether a chat template (its Jinja source) writes tool calls in this format."""

    @abstractmethod
    def parse(self, text: str) -> ParsedOutput | None: ...

    @abstractmethod
    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        """The text that describes `tools` (OpenAI tool objects) to the model, for the system message."""

    @abstractmethod
    def render_calls(self, content: str, calls: list[ParsedCall]) -> str:
        """An assistant turn's text: its `content`, then its calls."""

    @abstractmethod
    def render_results(self, results: list[str]) -> str:
        """The user turn that carries consecutive tool results back to the model."""

    @abstractmethod
    def forced_prefix(self, name: str | None) -> str:
        """The start of a call, written into the prompt to make the model call a tool (`name`: that one)."""


class HermesFormat(ToolCallFormat):
    name = 'hermes'
    _BLOCK = re.compile(r'<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z', re.DOTALL)

    def detect(self, chat_template: str) -> bool:
        return '<tool_call>' in chat_template

    def parse(self, text: str) -> ParsedOutput | None:
        if '<tool_call>' not in text:
            return None
        calls = []
        for match in self._BLOCK.finditer(text):
            call = _call(match.group(1) if match.group(1) is not None else match.group(2))
            if call is None:
                return None
            calls.append(call)
        content = self._BLOCK.sub('', text).strip()
        return ParsedOutput(content or None, calls)

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        listed = ''.join(f'\n{json.dumps(tool, ensure_ascii=False)}' for tool in tools)
        return (
            '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'
            'You are provided with function signatures within <tools></tools> XML tags:\n'
            f'<tools>{listed}\n</tools>\n\n'
            'For each function call, return a json object with function name and arguments within '
            '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
            '<args-json-object>}\n</tool_call>'
        )

    def render_calls(self, content: str, calls: list[ParsedCall]) -> str:
        blocks = [
            f'<tool_call>\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}\n</tool_call>' for c in calls
        ]
        return '\n'.join([content, *blocks] if content else blocks)

    def render_results(self, results: list[str]) -> str:
        return '\n'.join(f'<tool_response>\n{r}\n</tool_response>' for r in results)

    def forced_prefix(self, name: str | None) -> str:
        return '<tool_call>\n{"name": ' + (f'{json.dumps(name)}, "arguments": ' if name is not None else '"')


def _call(body: str) -> ParsedCall | None:
    """A call from one block's JSON (``{"name", "arguments"}``; ``parameters`` is read as arguments too)."""
    try:
        obj = json.loads(body.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get('name'), str) or not obj['name']:
        return None
    args = obj.get('arguments', obj.get('parameters', {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            return None
        return ParsedCall(obj['name'], args)
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj['name'], json.dumps(args, ensure_ascii=False))


FORMATS: dict[str, ToolCallFormat] = {}
FALLBACK = 'hermes'


def register(fmt: ToolCallFormat) -> None:
    """Make `fmt` available to `format_for` (checked in registration order)."""
    FORMATS[fmt.name] = fmt


register(HermesFormat())


def format_for(chat_template: str | None) -> ToolCallFormat:
    """The format whose markers the template names, else `FALLBACK`."""
    for fmt in FORMATS.values():
        if chat_template and fmt.detect(chat_template):
            return fmt
    return FORMATS[FALLBACK]
