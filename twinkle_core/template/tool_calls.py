"""Tool-call formats: how a model family writes tool calls in its output, and how tools, calls and results are
rendered for a chat template that cannot render them itself. One source for the training side (`ChatTemplate`)
and the serving side (the OpenAI-compatible endpoint), so a model is trained on the prompts it is served with.

A format is chosen by the chat template that names its markers (`format_for`); a template that names none gets
`FALLBACK` (``hermes``). Whether a template renders tools itself is found by rendering a probe conversation
(`renders_tools`); one that does not gets plain turns (`plain_tool_turns`): the tool list in the system message,
calls in the assistant's text, results in a user turn, all in the format the output is parsed in. Add a family by
subclassing `ToolCallFormat` and calling `register`.

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

PROBE_TOOL, PROBE_CALL, PROBE_RESULT = 'twinkle_probe_tool', 'twinkle_probe_call', 'twinkle_probe_result'


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
    call_open, call_close = '<tool_call>', '</tool_call>'
    _BLOCK = re.compile(r'<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z', re.DOTALL)

    def detect(self, chat_template: str) -> bool:
        return self.call_open in chat_template

    def parse(self, text: str) -> ParsedOutput | None:
        if self.call_open not in text:
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


HERMES = HermesFormat()
register(HERMES)


def format_for(chat_template: str | None) -> ToolCallFormat:
    """The format whose markers the template names, else `FALLBACK`."""
    for fmt in FORMATS.values():
        if chat_template and fmt.detect(chat_template):
            return fmt
    return FORMATS[FALLBACK]


def renders_tools(tokenizer: Any) -> bool:
    """Whether `tokenizer`'s chat template renders tool definitions, assistant tool calls and tool results itself
    (found by rendering a probe conversation; a template that raises on it does not)."""
    call = {'type': 'function', 'id': 'call_0', 'function': {'name': PROBE_CALL, 'arguments': {}}}
    messages: list[dict[str, Any]] = [
        {'role': 'user', 'content': 'hi'},
        {'role': 'assistant', 'content': '', 'tool_calls': [call]},
        {'role': 'tool', 'content': PROBE_RESULT, 'tool_call_id': 'call_0'},
    ]
    tool = {'type': 'function', 'function': {'name': PROBE_TOOL, 'parameters': {'type': 'object'}}}
    try:
        text = tokenizer.apply_chat_template(messages, tools=[tool], add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that fails on tools does not support them
        return False
    return all(marker in text for marker in (PROBE_TOOL, PROBE_CALL, PROBE_RESULT))


def uses_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
    """Whether a conversation (transformers' message dicts) has tools, tool calls or tool results to render."""
    return bool(tools) or any(m.get('role') == 'tool' or m.get('tool_calls') for m in messages)


def native_tool_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` for a template that renders tools itself: each call's ``arguments`` as an object where its text is
    JSON (transformers' convention; OpenAI sends the text), else as given."""
    return [
        {**m, 'tool_calls': [_parsed_arguments(c) for c in m['tool_calls']]} if m.get('tool_calls') else m
        for m in messages
    ]


def _parsed_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get('function')
    if not isinstance(function, dict) or not isinstance(function.get('arguments'), str):
        return call
    try:
        arguments = json.loads(function['arguments'])
    except ValueError:
        return call
    return {**call, 'function': {**function, 'arguments': arguments}}


def plain_tool_turns(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, fmt: ToolCallFormat
) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """`messages` (transformers' dicts: ``tool_calls`` on assistant turns, ``tool`` role results; text content) as
    system / user / assistant turns carrying `fmt`'s text: the tools described in the system message (appended to
    the first one, or a new one), calls after the assistant's content, consecutive results in one user turn.

    Returns the turns and, per turn, the indices of the input messages it came from (none for an added system turn).
    A call's ``arguments`` text is kept verbatim (an object is written as JSON), so a call re-rendered from what the
    model wrote reads as it was sampled.
    """
    out: list[dict[str, Any]] = []
    sources: list[list[int]] = []
    results: list[int] = []

    def flush_results() -> None:
        if results:
            out.append({'role': 'user', 'content': fmt.render_results([messages[j]['content'] for j in results])})
            sources.append(list(results))
            results.clear()

    for i, m in enumerate(messages):
        if m['role'] == 'tool':
            results.append(i)
            continue
        flush_results()
        text = m.get('content') or ''
        if m['role'] == 'assistant' and m.get('tool_calls'):
            text = fmt.render_calls(text, [_as_call(c) for c in m['tool_calls']])
        out.append({'role': 'system' if m['role'] == 'developer' else m['role'], 'content': text})
        sources.append([i])
    flush_results()
    if tools:
        described = fmt.system_prompt(tools)
        if out and out[0]['role'] == 'system':
            out[0] = {'role': 'system', 'content': f'{out[0]["content"]}\n\n{described}'}
        else:
            out.insert(0, {'role': 'system', 'content': described})
            sources.insert(0, [])
    return out, sources


def _as_call(call: dict[str, Any]) -> ParsedCall:
    function = call.get('function', call)
    arguments = function.get('arguments', {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ParsedCall(function['name'], text)
