"""`APIMultiTurnRollout`: the multi-turn tool loop over an OpenAI-compatible chat-completions endpoint.

    from openai import OpenAI
    api = OpenAI(base_url='http://127.0.0.1:8000/v1', api_key=key)
    rollout = APIMultiTurnRollout(api, ToolManager(['calculator']), model='base', max_turns=4, concurrency=8)
    episodes = rollout(trajectories)

For evaluating served models or collecting data from them: the endpoint renders the conversation and parses tool
calls, so episodes carry ``messages`` (tool turns included), ``turns``, ``tool_calls``, ``stop_reason``,
``truncated``, the token usage the endpoint reported and, with an env, ``reward`` -- but no token ids or log-probs
(train on episodes from `MultiTurnRollout`). Episodes run concurrently, `concurrency` at a time.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

from twinkle_agentic.parsing import ParsedTurn, parse_openai_message
from twinkle_agentic.rollout.actions import (
    env_respond,
    env_step,
    is_env_tool,
    new_env,
    no_tools_message,
    tool_message,
    tool_schemas,
)
from twinkle_agentic.rollout.episode import TRUNCATING
from twinkle_core.errors import InvalidInputError
from twinkle_core.types import Trajectory


class APIMultiTurnRollout:
    """Multi-turn episodes against `api` (an ``openai.OpenAI`` client, or anything with
    ``chat.completions.create``).

    Args:
        api: the client. tool_manager: the tools episodes may call (besides the env's).
        model: the endpoint's model name (a base model or a trained checkpoint's name).
        env / env_kwargs: an `Env` per episode (class, factory or registered name), as in `MultiTurnRollout`.
        max_turns / max_tool_calls: per episode. concurrency: episodes in flight at once.
        request_kwargs: extra ``chat.completions.create`` arguments (``temperature``, ``max_tokens``, ``seed``...).
        rollout_timeout_s: wall-clock limit of one call (``rollout_timeout`` for the episodes it cuts).
    """

    def __init__(
        self,
        api: Any,
        tool_manager: Any = None,
        *,
        model: str,
        env: Any = None,
        env_kwargs: Mapping[str, Any] | None = None,
        max_turns: int = 6,
        max_tool_calls: int | None = None,
        concurrency: int = 8,
        request_kwargs: Mapping[str, Any] | None = None,
        rollout_timeout_s: float | None = None,
    ) -> None:
        if max_turns < 1 or concurrency < 1:
            raise InvalidInputError(f'max_turns and concurrency must be >= 1, got {max_turns} and {concurrency}.')
        self.api, self.tool_manager, self.model = api, tool_manager, model
        self.env, self.env_kwargs = env, dict(env_kwargs or {})
        self.max_turns, self.max_tool_calls, self.concurrency = max_turns, max_tool_calls, concurrency
        self.request_kwargs = dict(request_kwargs or {})
        self.rollout_timeout_s = rollout_timeout_s

    def __call__(self, trajectories: Sequence[Mapping[str, Any] | Trajectory]) -> list[dict[str, Any]]:
        """Run one episode per trajectory, `concurrency` at a time; returns them in order."""
        deadline = None if self.rollout_timeout_s is None else time.monotonic() + self.rollout_timeout_s
        items = [t.model_dump(exclude_none=True) if isinstance(t, Trajectory) else dict(t) for t in trajectories]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda data: self._episode(data, deadline), items))

    def _episode(self, data: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        messages = [dict(m) for m in data.get('messages') or []]
        if not messages:
            raise InvalidInputError('a trajectory has no messages; a rollout starts from a prompt conversation.')
        env = new_env(self.env, self.env_kwargs)
        if env is not None and (opening := env.reset(data)):
            messages.append({'role': 'user', 'content': opening})
        tools = list(data.get('tools') or []) + tool_schemas(env, self.tool_manager)
        turns = calls = 0
        usage = {'prompt_tokens': 0, 'completion_tokens': 0}
        stop: str | None = None
        while stop is None:
            if turns == self.max_turns:
                stop = 'max_turns'
                break
            if deadline is not None and time.monotonic() > deadline:
                stop = 'rollout_timeout'
                break
            response = self.api.chat.completions.create(
                model=self.model, messages=messages, **({'tools': tools} if tools else {}), **self.request_kwargs
            )
            turns += 1
            for key in usage:
                usage[key] += int(getattr(response.usage, key, 0) or 0) if response.usage is not None else 0
            choice = response.choices[0]
            assistant = _assistant_message(choice.message)
            messages.append(assistant)
            if choice.finish_reason == 'length':
                stop = 'length'
                break
            parsed: ParsedTurn = parse_openai_message(assistant)
            if not parsed.tool_calls and not parsed.errors:
                stop = self._respond(env, parsed.content, messages)
                continue
            if self.max_tool_calls is not None and calls + len(parsed.tool_calls) > self.max_tool_calls:
                stop = 'max_tool_calls'
                break
            calls += len(parsed.tool_calls)
            messages += [tool_message(f'Error: {err}') for err in parsed.errors]
            ids = [c.get('id') for c in assistant.get('tool_calls') or []]
            for i, call in enumerate(parsed.tool_calls):
                call_id = ids[i] if i < len(ids) else None
                if is_env_tool(env, call.name):
                    assert env is not None
                    step = env_step(env, call)
                    messages.append(tool_message(step.observation, call.name, call_id))
                    stop = 'stop' if step.done else stop
                elif self.tool_manager is None:
                    messages.append(no_tools_message(call.name))
                else:
                    out = self.tool_manager.call(call.name, call.arguments)
                    messages.append(tool_message(out.output, call.name, call_id))
        result = {**data, 'messages': messages, 'turns': turns, 'tool_calls': calls, 'usage': usage}
        result.update(stop_reason=stop, truncated=stop in TRUNCATING)
        if env is not None:
            result['reward'] = env.evaluate(result)
        return result

    @staticmethod
    def _respond(env: Any, text: str, messages: list[dict[str, Any]]) -> str | None:
        """A turn without tool calls: the env's answer (None: the episode goes on), or the end of the episode."""
        if env is None:
            return 'stop'
        result = env_respond(env, text)
        if result.done or not result.observation:
            return 'stop'
        messages.append({'role': 'user', 'content': result.observation})
        return None


def _assistant_message(message: Any) -> dict[str, Any]:
    """An OpenAI client's message object (or a dict) as a plain assistant message dict."""
    data = message.model_dump(exclude_none=True) if hasattr(message, 'model_dump') else dict(message)
    out: dict[str, Any] = {'role': 'assistant', 'content': data.get('content') or ''}
    if data.get('tool_calls'):
        out['tool_calls'] = data['tool_calls']
    return out
