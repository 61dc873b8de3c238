"""An OpenAI Agents SDK (`openai-agents`) agent with a function tool. It imports nothing of twinkle: the SDK's
default client is pointed at a rollout session's base URL (`set_default_openai_client`), on the Chat Completions
API, and every model call the runner makes is recorded for training."""

from __future__ import annotations

import asyncio
from typing import Any

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from weather_tool import forecast


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return forecast(city)


def run(base_url: str, api_key: str, model: str, question: str, *, stream: bool = False, **sampling: Any) -> str:
    """The agent's final answer to `question`."""
    client = AsyncOpenAI(base_url=base_url, api_key=api_key)
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api('chat_completions')
    set_tracing_disabled(True)
    settings = ModelSettings(temperature=sampling.get('temperature'), max_tokens=sampling.get('max_tokens'))
    # the model object, not its name: a name is parsed for a provider prefix ("tinker://..." would be one)
    chat_model = OpenAIChatCompletionsModel(model=model, openai_client=client)
    agent = Agent(name='forecaster', model=chat_model, tools=[get_weather], model_settings=settings)
    if not stream:
        return str(Runner.run_sync(agent, question, max_turns=3).final_output)

    async def streamed() -> str:
        result = Runner.run_streamed(agent, question, max_turns=3)
        async for _ in result.stream_events():
            pass
        return str(result.final_output)

    return asyncio.run(streamed())
