"""Tool calls in a sampled assistant turn, Qwen3 / Hermes format (`twinkle_core.template.tool_calls.HermesFormat`,
the format templates without tool support are prompted in), and their OpenAI message shape.

A call is ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; a turn may hold several, with text
around them. `parse_turn` never raises: each block it cannot read becomes an entry of `ParsedTurn.errors`, a
sentence meant to be shown to the model (e.g. as a tool response) so it can correct itself. Tool results go back
as ``<tool_response>\\n...\\n</tool_response>`` blocks in a user turn (`format_tool_response`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from twinkle_core.template.tool_calls import HERMES, ParsedCall

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = HERMES.call_open, HERMES.call_close
_BLOCK = re.compile(r'<tool_call>(.*?)</tool_call>', re.DOTALL)
_SNIPPET = 80


@dataclass
class ToolCall:
    """One call: the tool's `name`, its `arguments` (a JSON object), and `raw`, the block's text as sampled."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ''


@dataclass
class ParsedTurn:
    """An assistant turn split into `content` (the text outside tool-call blocks, stripped), the well-formed
    `tool_calls` in order, and `errors`: one readable sentence per block that could not be read."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _snippet(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + '...'


def _parse_body(body: str, raw: str) -> ToolCall | str:
    """The call in one block's JSON, or an error sentence."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return f'tool call is not valid JSON ({exc.msg} at position {exc.pos}): {_snippet(body)!r}'
    if not isinstance(obj, dict):
        return f'tool call must be a JSON object with "name" and "arguments", got {type(obj).__name__}'
    name = obj.get('name')
    if not isinstance(name, str) or not name.strip():
        return f'tool call has no "name" (a non-empty string): {_snippet(body)!r}'
    arguments: Any = obj.get('arguments', obj.get('parameters', {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI sends them
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return f'tool call {name!r}: "arguments" is a string that is not a JSON object: {_snippet(arguments)!r}'
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return f'tool call {name!r}: "arguments" must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(name=name.strip(), arguments=arguments, raw=raw)


def parse_turn(text: str) -> ParsedTurn:
    """Split a sampled assistant turn into text and tool calls. Never raises; see `ParsedTurn`.

    A ``<tool_call>`` without its ``</tool_call>`` (e.g. the sample hit its token limit) is an error and its text
    is dropped from `content`; a stray ``</tool_call>`` is left in `content`.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    outside: list[str] = []
    pos = 0
    for match in _BLOCK.finditer(text):
        outside.append(text[pos : match.start()])
        pos = match.end()
        body = match.group(1)
        if TOOL_CALL_OPEN in body:  # an earlier block was never closed
            errors.append(f'unclosed {TOOL_CALL_OPEN} (every call must end with {TOOL_CALL_CLOSE})')
            body = body[body.rindex(TOOL_CALL_OPEN) + len(TOOL_CALL_OPEN) :]
        result = _parse_body(body, match.group(0))
        if isinstance(result, ToolCall):
            calls.append(result)
        else:
            errors.append(result)
    rest = text[pos:]
    if TOOL_CALL_OPEN in rest:
        at = rest.index(TOOL_CALL_OPEN)
        tail = rest[at + len(TOOL_CALL_OPEN) :]
        errors.append(f'unclosed {TOOL_CALL_OPEN} (every call must end with {TOOL_CALL_CLOSE}): {_snippet(tail)!r}')
        rest = rest[:at]
    outside.append(rest)
    return ParsedTurn(content=''.join(outside).strip(), tool_calls=calls, errors=errors)


def format_tool_call(call: ToolCall) -> str:
    """The block a model writes for `call` (as the fixture and Qwen3 chat templates render it)."""
    return HERMES.render_calls('', [ParsedCall(call.name, json.dumps(call.arguments, ensure_ascii=False))])


def format_tool_response(output: str) -> str:
    """One tool result as the block Qwen3 puts in a user turn (consecutive results: join with ``'\\n'``)."""
    return HERMES.render_results([output])


def to_openai_tool_calls(calls: list[ToolCall], start: int = 0) -> list[dict[str, Any]]:
    """The ``tool_calls`` of an OpenAI assistant message: ids ``call_<n>`` from `start`, arguments as JSON text."""
    return [
        {
            'id': f'call_{start + i}',
            'type': 'function',
            'function': {'name': c.name, 'arguments': json.dumps(c.arguments, ensure_ascii=False)},
        }
        for i, c in enumerate(calls)
    ]


def from_openai_tool_calls(tool_calls: list[dict[str, Any]] | None) -> ParsedTurn:
    """Calls of an OpenAI assistant message (``message['tool_calls']``, arguments as JSON text or an object) as a
    `ParsedTurn` with empty content; unreadable calls become `errors`, as in `parse_turn`."""
    turn = ParsedTurn(content='')
    for item in tool_calls or []:
        function = item.get('function', item) if isinstance(item, dict) else None
        if not isinstance(function, dict):
            turn.errors.append(f'tool call must be an object, got {type(item).__name__}')
            continue
        raw = json.dumps(item, ensure_ascii=False, default=str)
        arguments = function.get('arguments')
        body = {'name': function.get('name'), 'arguments': {} if arguments is None else arguments}
        result = _parse_body(json.dumps(body, ensure_ascii=False, default=str), raw)
        if isinstance(result, ToolCall):
            turn.tool_calls.append(result)
        else:
            turn.errors.append(result)
    return turn


def parse_openai_message(message: dict[str, Any]) -> ParsedTurn:
    """An assistant message from an OpenAI-compatible endpoint as a `ParsedTurn`: its ``tool_calls`` when it has
    any, else its text parsed with `parse_turn` (an endpoint that did not parse calls returns them as text)."""
    content = message.get('content')
    if isinstance(content, list):  # text parts
        content = '\n'.join(p.get('text', '') for p in content if isinstance(p, dict))
    text = content if isinstance(content, str) else ''
    if message.get('tool_calls'):
        turn = from_openai_tool_calls(message['tool_calls'])
        turn.content = text.strip()
        return turn
    return parse_turn(text)
