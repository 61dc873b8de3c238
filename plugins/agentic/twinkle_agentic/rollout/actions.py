"""What both rollouts do with a policy's turn: route tool calls to the episode's env or to the tool manager, and
turn every answer -- results, errors, env observations -- into the message the policy reads next."""

from __future__ import annotations

from typing import Any

from twinkle_agentic.parsing import ToolCall
from twinkle_core.env.base import Env, StepResult
from twinkle_core.registry import resolve


def is_env_tool(env: Env | None, name: str) -> bool:
    """Whether `name` is one of `env`'s tools (those calls go to `Env.step`, before any tool of the manager)."""
    return env is not None and any(t.name == name for t in env.tools())


def env_step(env: Env, call: ToolCall) -> StepResult:
    """`env.step` for `call`, recorded for `Env.evaluate`; an env that fails on the action answers with the error."""
    try:
        result = env.step(call.name, call.arguments)
    except Exception as exc:  # noqa: BLE001 - an env failing on one action is reported to the policy
        result = StepResult(observation=f'Error: {call.name} failed: {type(exc).__name__}: {exc}')
    return env.record(result)


def env_respond(env: Env, text: str) -> StepResult:
    """`env.respond` for a turn without tool calls, recorded for `Env.evaluate`."""
    return env.record(env.respond(text))


def tool_message(content: str, name: str | None = None, call_id: str | None = None) -> dict[str, Any]:
    """A ``tool`` message answering one call (or reporting an unreadable one)."""
    message: dict[str, Any] = {'role': 'tool', 'content': content}
    if name:
        message['name'] = name
    if call_id:
        message['tool_call_id'] = call_id
    return message


def no_tools_message(name: str) -> dict[str, Any]:
    return tool_message(f"Error: unknown tool '{name}'; no tools are available.", name)


def new_env(env: Any, env_kwargs: dict[str, Any]) -> Env | None:
    """One episode's env: `env` is None, a registered env name, or a class/factory called with `env_kwargs`."""
    if env is None:
        return None
    if isinstance(env, str):
        return resolve('env', env, **env_kwargs)
    return env(**env_kwargs)


def tool_schemas(env: Env | None, tool_manager: Any) -> list[dict[str, Any]]:
    """The ``tools`` shown to the policy: the env's, then the tool manager's."""
    schemas = [t.schema() for t in env.tools()] if env is not None else []
    return schemas + (tool_manager.schemas() if tool_manager is not None else [])
