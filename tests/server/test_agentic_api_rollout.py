"""`APIMultiTurnRollout` (twinkle-agentic) against this server's OpenAI-compatible endpoint, through the official
`openai` client: a LoRA adapter trained to call `get_weather` makes the call, the tool answers, the answer goes
back in the next request; with an env, episodes of several turns run concurrently and get their rewards."""

from __future__ import annotations

import json

import openai
import pytest
from openai_tools import QUESTION, TOOLS
from server_names import MODEL

from twinkle_agentic.rollout import APIMultiTurnRollout
from twinkle_agentic.tools import ToolManager, tool


@tool(sandboxed=False)
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return json.dumps({'city': city, 'temperature_c': 21})


@pytest.fixture(scope='module')
def api(server, alice):
    with openai.OpenAI(base_url=f'{server.base_url}/v1', api_key=alice, max_retries=0, timeout=120) as client:
        yield client


def test_a_trained_adapter_calls_the_tool_and_reads_its_answer(api, tool_adapter):
    assert get_weather.schema() == TOOLS[0]  # the prompt the adapter was trained on
    rollout = APIMultiTurnRollout(
        api,
        ToolManager([get_weather]),
        model=tool_adapter,
        max_turns=2,
        request_kwargs={'temperature': 0, 'max_tokens': 48},
    )
    (episode,) = rollout([{'messages': QUESTION}])
    assistant, answer = episode['messages'][1], episode['messages'][2]
    call = assistant['tool_calls'][0]
    assert call['function']['name'] == 'get_weather' and json.loads(call['function']['arguments']) == {'city': 'Paris'}
    assert answer == {
        'role': 'tool',
        'content': '{"city": "Paris", "temperature_c": 21}',
        'name': 'get_weather',
        'tool_call_id': call['id'],
    }
    assert episode['turns'] == 2 and episode['tool_calls'] >= 1 and len(episode['messages']) >= 4
    assert episode['usage']['prompt_tokens'] > episode['usage']['completion_tokens'] > 0


def test_env_episodes_run_concurrently_and_are_scored(api):
    """The base model answers in text; GuessNumberEnv reads each answer as a guess and replies, so an episode runs
    until its guesses are spent (or a lucky hit) -- several requests per episode, four episodes two at a time."""
    rollout = APIMultiTurnRollout(
        api,
        model=MODEL,
        env='GuessNumberEnv',
        env_kwargs={'max_guesses': 3},
        max_turns=5,
        concurrency=2,
        # the random base model rarely ends a turn by itself: stop sequences end its answers
        request_kwargs={'temperature': 1.0, 'max_tokens': 16, 'seed': 3, 'stop': [' ', '\n', '.', ',']},
    )
    prompts = [
        {'messages': [{'role': 'user', 'content': 'Guess my number.'}], 'user_data': {'secret': s}}
        for s in (7, 42, 64, 99)
    ]
    episodes = rollout(prompts)
    assert [e['user_data']['secret'] for e in episodes] == [7, 42, 64, 99]  # in order
    for e in episodes:
        assert e['stop_reason'] in ('stop', 'length') and 1 <= e['turns'] <= 3
        assert e['reward'] in (0.0, 1.0)
        roles = [m['role'] for m in e['messages']]
        assert roles[:2] == ['user', 'assistant'] and roles.count('assistant') == e['turns']
    assert any(e['turns'] > 1 for e in episodes)


def test_unknown_model_is_the_clients_error(api):
    rollout = APIMultiTurnRollout(api, model='no-such-model')
    with pytest.raises(openai.NotFoundError):
        rollout([{'messages': QUESTION}])
