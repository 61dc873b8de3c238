"""A tool, a question that calls for it, and a LoRA adapter trained through the tinker SDK to call it: shared by
the OpenAI-endpoint tests and the agentic API-rollout tests (the fixture is session-wide: trained once)."""

from __future__ import annotations

import json
import math

import pytest
from server_names import MODEL
from tinker import types

from twinkle_server.api.openai.chat import ChatRenderer
from twinkle_server.api.openai.schemas import ChatCompletionRequest

TOOLS = [
    {
        'type': 'function',
        'function': {
            'name': 'get_weather',
            'description': 'The current weather in a city.',
            'parameters': {'type': 'object', 'properties': {'city': {'type': 'string'}}, 'required': ['city']},
        },
    }
]
QUESTION = [{'role': 'user', 'content': 'What is the weather in Paris?'}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def request(**body) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate_json(json.dumps({'model': MODEL, **body}))


def prompt_ids(tokenizer, messages, tools=None) -> list[int]:
    """The prompt the server renders for `messages` (the same renderer, in this process)."""
    text = ChatRenderer(tokenizer).render(request(messages=messages, tools=tools)).text
    return tokenizer(text, add_special_tokens=False)['input_ids']


@pytest.fixture(scope='session')
def tool_adapter(service_client, tokenizer) -> str:
    """A LoRA adapter trained (tinker SDK, cross-entropy) until it answers QUESTION-with-TOOLS by calling
    get_weather(city="Paris"): until every answer token has probability > 0.6, so greedy decoding writes exactly the
    call (~50 steps). Saved with save_weights_for_sampler as 'oa-tool-caller'."""
    prompt = prompt_ids(tokenizer, QUESTION, TOOLS)
    answer = tokenizer(CALL_TEXT, add_special_tokens=False)['input_ids'] + [tokenizer.eos_token_id]
    tokens = prompt + answer
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={'target_tokens': tokens[1:], 'weights': [0.0] * (len(prompt) - 1) + [1.0] * len(answer)},
    )
    tc = service_client.create_lora_training_client(base_model=MODEL, rank=16, seed=0).result()
    worst = -math.inf
    for _ in range(200):
        fwd = tc.forward_backward([datum], 'cross_entropy')
        opt = tc.optim_step(types.AdamParams(learning_rate=3e-3))
        worst = min(fwd.result().loss_fn_outputs[0]['logprobs'].tolist()[len(prompt) - 1 :])
        opt.result()
        if worst > math.log(0.6):
            break
    assert worst > math.log(0.6), f'the adapter did not learn the tool call (least likely answer token: {worst})'
    return tc.save_weights_for_sampler('oa-tool-caller').result().path
