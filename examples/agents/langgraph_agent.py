"""A LangGraph ReAct agent (`langgraph` + `langchain-openai`) with a tool. It imports nothing of twinkle:
`ChatOpenAI` takes a rollout session's base URL, and every model call the graph makes is recorded for training."""

from __future__ import annotations

from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent
from weather_tool import forecast


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return forecast(city)


def run(base_url: str, api_key: str, model: str, question: str, *, stream: bool = False, **sampling: Any) -> str:
    """The agent's final answer to `question`."""
    llm = ChatOpenAI(base_url=base_url, api_key=api_key, model=model, streaming=stream, **sampling)
    graph = create_react_agent(llm, [get_weather])
    state = graph.invoke({'messages': [('user', question)]}, {'recursion_limit': 7})
    return str(state['messages'][-1].content)
