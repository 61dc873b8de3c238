"""An agent written against the plain `openai` SDK: ask, run the tools the model calls, send the results back, until
it answers. It imports nothing of twinkle -- point `base_url` at a rollout session (`…/v1/rollouts/{id}/v1`) and
every call it makes is recorded for training."""

from __future__ import annotations

import json
from typing import Any

import openai
from weather_tool import forecast

TOOLS = [
    {
        'type': 'function',
        'function': {
            'name': 'get_weather',
            'description': 'The current weather in a city.',
            'parameters': {'properties': {'city': {'type': 'string'}}, 'required': ['city'], 'type': 'object'},
        },
    }
]


def run(
    base_url: str, api_key: str, model: str, question: str, *, max_turns: int = 3, stream: bool = False, **sampling: Any
) -> str:
    """The agent's final answer to `question` (at most `max_turns` model calls)."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key)
    messages: list[dict[str, Any]] = [{'role': 'user', 'content': question}]
    for _ in range(max_turns):
        message = _ask(client, model, messages, stream, sampling)
        messages.append(message)
        if not message.get('tool_calls'):
            return message.get('content') or ''
        for call in message['tool_calls']:
            arguments = json.loads(call['function']['arguments'] or '{}')
            result = forecast(**arguments) if call['function']['name'] == 'get_weather' else 'no such tool'
            messages.append({'role': 'tool', 'tool_call_id': call['id'], 'content': result})
    return ''


def _ask(client: openai.OpenAI, model: str, messages: list, stream: bool, sampling: dict) -> dict[str, Any]:
    """One call; the assistant message as a dict (assembled from the chunks when streamed)."""
    if not stream:
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, **sampling)
        return reply.choices[0].message.model_dump(exclude_none=True)
    content, calls = '', {}
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True, **sampling):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        content += delta.content or ''
        for c in delta.tool_calls or []:
            call = calls.setdefault(
                c.index, {'id': c.id, 'type': 'function', 'function': {'name': '', 'arguments': ''}}
            )
            call['function']['name'] += c.function.name or ''
            call['function']['arguments'] += c.function.arguments or ''
    message: dict[str, Any] = {'role': 'assistant', 'content': content}
    if calls:
        message['tool_calls'] = [calls[i] for i in sorted(calls)]
    return message
