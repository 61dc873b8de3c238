"""Three agents that import nothing of twinkle -- the plain `openai` SDK (examples/agents/openai_agent.py), the OpenAI
Agents SDK (agents_sdk_agent.py) and LangGraph (langgraph_agent.py) -- run unmodified against a rollout session's
base URL, streamed and not. The policy is a LoRA adapter trained here (tinker SDK) on each framework's own tool
schema to call `get_weather` and then answer from its result, so every framework's loop runs a real tool round
trip and ends. Each run is recorded as one token-exact episode: the tool call the framework sends back
(re-serialised its own way) is matched to what was sampled, the tool's result is inserted (not trained)."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import pytest

from tests.server.openai_tools import CALL_TEXT, prompt_ids
from tests.server.server_names import MODEL, openai_client

AGENTS = Path(__file__).resolve().parents[2] / 'examples' / 'agents'
QUESTION = 'What is the weather in Paris?'
RESULT = '18 C and sunny'
ANSWER = 'It is 18 C and sunny.'
PACKAGES = {'openai_agent': 'openai', 'agents_sdk_agent': 'agents', 'langgraph_agent': 'langgraph'}  # what each needs


def agent(name: str):
    if str(AGENTS) not in sys.path:
        sys.path.insert(0, str(AGENTS))
    return importlib.import_module(name)


def framework_tools() -> list[list[dict]]:
    """The distinct tool lists the installed frameworks send for their `get_weather` (LangChain's equals the
    plain-SDK example's, the Agents SDK's is stricter)."""
    names = [name for name, package in PACKAGES.items() if importlib.util.find_spec(package) is not None]
    tools = [agent('train_agent').tool_schemas(name) for name in names]
    distinct = {json.dumps(t): t for t in tools}
    return list(distinct.values())


@pytest.fixture(scope='module')
def weather_agent_policy(service_client, tokenizer) -> str:
    """A LoRA adapter trained (cross-entropy, tinker SDK) on every framework's tool schema to answer QUESTION with
    the get_weather call, and the tool's result with ANSWER, each answer token at probability > 0.5 (greedy
    decoding writes them); saved for sampling."""
    from tinker import types

    call = {'id': 'call_0', 'type': 'function'}
    call['function'] = {'name': 'get_weather', 'arguments': '{"city": "Paris"}'}
    asked = [{'role': 'user', 'content': QUESTION}]
    answered = asked + [
        {'role': 'assistant', 'content': '', 'tool_calls': [call]},
        {'role': 'tool', 'tool_call_id': 'call_0', 'content': RESULT},
    ]
    data, spans = [], []
    for tools in framework_tools():
        for messages, reply in ((asked, CALL_TEXT), (answered, ANSWER)):
            prompt = prompt_ids(tokenizer, messages, tools)
            target = tokenizer(reply, add_special_tokens=False)['input_ids'] + [tokenizer.eos_token_id]
            ids = prompt + target
            weights = [0.0] * (len(prompt) - 1) + [1.0] * len(target)
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(ids[:-1]),
                    loss_fn_inputs={'target_tokens': ids[1:], 'weights': weights},
                )
            )
            spans.append(len(prompt) - 1)
    training = service_client.create_lora_training_client(base_model=MODEL, rank=16, seed=0).result()
    worst = -1e9
    for _ in range(300):
        fwd = training.forward_backward(data, 'cross_entropy')  # queued with the step: one round trip each
        opt = training.optim_step(types.AdamParams(learning_rate=3e-3))
        worst = min(min(o['logprobs'].tolist()[start:]) for o, start in zip(fwd.result().loss_fn_outputs, spans))
        opt.result()
        if worst > math.log(0.5):  # every answer token the most likely one: greedy decoding writes them
            break
    assert worst > math.log(0.5), f'the adapter did not learn the tool round trip (least likely answer token: {worst})'
    return training.save_weights_for_sampler('weather-agent').result().path


@pytest.mark.slow  # training the policy takes ~1.5 min
@pytest.mark.parametrize(
    'framework,stream',
    [
        ('openai_agent', False),
        ('openai_agent', True),
        ('agents_sdk_agent', False),
        ('agents_sdk_agent', True),
        ('langgraph_agent', False),
        ('langgraph_agent', True),
    ],
)
def test_an_unmodified_agent_is_recorded_as_one_episode(
    server, alice, weather_agent_policy, tokenizer, framework, stream
):
    pytest.importorskip(PACKAGES[framework])
    with openai_client(server, alice) as client:
        session = client.post('/rollouts', body={'model': weather_agent_policy}, cast_to=object)
        base_url = f'{server.base_url}{session["base_url"]}'
        answer = agent(framework).run(base_url, alice, weather_agent_policy, QUESTION, stream=stream, temperature=0.0)
        result = client.get(f'/rollouts/{session["id"]}/episodes', cast_to=object)
    assert answer.strip() == ANSWER  # the framework's loop ran the tool and ended on the trained answer
    assert result['splits'] == [] and len(result['data']) == 1, result
    episode = result['data'][0]
    assert len(episode['calls']) >= 2, tokenizer.decode(episode['input_ids'])  # the tool call, then the answer
    trained = [t for t, label in zip(episode['input_ids'], episode['labels']) if label != -100]
    assert len(trained) == len(episode['logprobs'])
    sampled = tokenizer.decode(trained, skip_special_tokens=False)
    assert 'get_weather' in sampled and '<tool_response>' not in sampled  # the tool's result is not trained
    assert f'<tool_response>\n{RESULT}' in tokenizer.decode(episode['input_ids'])  # but is in the episode


@pytest.mark.slow
@pytest.mark.parametrize('client', ['tinker', 'twinkle'])
def test_the_training_example_runs_with_either_client(server, alice, client) -> None:
    """examples/agents/train_agent.py end to end in a few steps (its learning is measured in docs/benchmarks.md):
    the warm-start, a GRPO step on the agent's recorded episodes, a measuring round -- through the tinker SDK and
    through the native client."""
    train_agent = agent('train_agent')
    args = train_agent.parser().parse_args(
        ['--base-url', server.base_url, '--api-key', alice, '--base-model', MODEL, '--client', client]
        + ['--warmup-steps', '3', '--steps', '1', '--group-size', '2', '--concurrency', '4']
    )
    history = train_agent.train(args)
    assert len(history['reward']) == 2 and len(history['loss']) == 1, history
    assert math.isfinite(history['loss'][0]) and all(0.0 <= r <= 1.0 for r in history['reward'])
    assert min(history['episodes/run']) >= 1.0  # every run was recorded: each made at least one call
