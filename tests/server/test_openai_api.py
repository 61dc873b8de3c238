"""The OpenAI-compatible endpoint (`/v1/...`, docs/openai.md) through the official `openai` client against a real
server (uvicorn on 127.0.0.1, tiny Qwen3 fixture, TorchSampler): models, chat and completions with and without
streaming, log-probs checked against a plain `transformers` forward, seeds, stop sequences, a tool-call round trip
with an adapter trained (through the `tinker` SDK) to call a tool, checkpoints as models and another tenant's 404,
and errors in OpenAI's shape raised as the client's exception classes.

The tiny model's chat template renders tools itself (Qwen3 style); the rendering for other templates is checked
in process in test_openai_tool_rendering.py."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from openai_tools import CALL_TEXT, QUESTION, TOOLS, prompt_ids, request
from server_names import MODEL, openai_client

from twinkle_server.api.openai.chat import ChatRenderer

RESULT = '{"temperature_c": 21}'
HELLO = [{'role': 'user', 'content': 'Say hello.'}]


# A Qwen2.5-style template that renders tools, tool calls and tool results itself (the tiny model's does not).
# ChatML without tool support: the server must write the tools and calls itself
@pytest.fixture(scope='module')
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


# ---- models ---------------------------------------------------------------------------------------------------------
def test_models_lists_base_models_and_only_the_callers_checkpoints(client, bob_client, tool_adapter):
    mine = {m.id: m for m in client.models.list()}
    assert MODEL in mine and mine[MODEL].owned_by == 'twinkle'
    assert tool_adapter in mine
    card = mine[tool_adapter]
    assert card.owned_by == 'alice' and card.model_extra['root'] == MODEL
    assert card.model_extra['alias'] == f'{MODEL}:oa-tool-caller'
    assert client.models.retrieve(MODEL).id == MODEL
    assert client.models.retrieve(tool_adapter).id == tool_adapter
    assert client.models.retrieve(f'{MODEL}:oa-tool-caller').id == tool_adapter
    theirs = {m.id for m in bob_client.models.list()}
    assert MODEL in theirs and tool_adapter not in theirs


# ---- chat ---------------------------------------------------------------------------------------------------------
def test_chat_streaming_reassembles_to_the_non_streaming_answer(client):
    kwargs = dict(model=MODEL, messages=HELLO, max_tokens=12, temperature=1.0, seed=11, n=2)
    whole = client.chat.completions.create(**kwargs)
    assert whole.object == 'chat.completion' and [c.index for c in whole.choices] == [0, 1]
    assert whole.usage.completion_tokens <= 24 and whole.usage.total_tokens == (
        whole.usage.prompt_tokens + whole.usage.completion_tokens
    )
    texts: dict[int, str] = {0: '', 1: ''}
    finish: dict[int, str] = {}
    roles = []
    usage = None
    with client.chat.completions.create(**kwargs, stream=True, stream_options={'include_usage': True}) as stream:
        for chunk in stream:
            assert chunk.object == 'chat.completion.chunk'
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                roles += [c.delta.role] if c.delta.role else []
                texts[c.index] += c.delta.content or ''
                if c.finish_reason:
                    finish[c.index] = c.finish_reason
    assert roles == ['assistant', 'assistant']
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finish == {c.index: c.finish_reason for c in whole.choices}
    assert usage == whole.usage


def test_seed_reproduces_and_another_seed_differs(client):
    def texts(seed):
        r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=1.0, seed=seed, n=3)
        return [c.message.content for c in r.choices]

    first = texts(5)
    assert texts(5) == first
    assert texts(6) != first


def test_stop_sequence_cuts_the_answer(client):
    greedy = dict(model=MODEL, messages=HELLO, max_tokens=24, temperature=0)
    full = client.chat.completions.create(**greedy).choices[0].message.content
    assert len(full) >= 6, full
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = client.chat.completions.create(**greedy, stop=[stop]).choices[0]
    assert cut.message.content == full[: full.find(stop)]
    assert cut.finish_reason == 'stop'


def test_chat_logprobs_are_the_models(client, tokenizer, hf_model):
    k = 3
    r = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=6, temperature=0, logprobs=True, top_logprobs=k
    )
    entries = r.choices[0].logprobs.content
    ids = prompt_ids(tokenizer, HELLO)
    assert r.usage.prompt_tokens == len(ids)
    assert 1 <= len(entries) <= 6
    for entry in entries:  # greedy: the model's most likely token at each step, with the reference's log-probs
        with torch.no_grad():
            row = hf_model(input_ids=torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
        top = row.topk(k)
        token = int(top.indices[0])
        assert entry.token == tokenizer.decode([token]) and entry.bytes == list(entry.token.encode())
        assert entry.logprob == pytest.approx(float(row[token]), abs=1e-4)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert [t.token for t in entry.top_logprobs] == [tokenizer.decode([int(i)]) for i in top.indices]
        ids.append(token)
    assert r.choices[0].message.content == tokenizer.decode(ids[r.usage.prompt_tokens :], skip_special_tokens=True)


# ---- completions --------------------------------------------------------------------------------------------------
def test_completions_text_ids_several_prompts_and_streaming(client, tokenizer):
    r = client.completions.create(model=MODEL, prompt='User: Say hello.\nAssistant:', max_tokens=5, seed=1)
    assert r.object == 'text_completion' and len(r.choices) == 1 and r.choices[0].finish_reason in ('stop', 'length')
    assert r.usage.prompt_tokens == len(tokenizer('User: Say hello.\nAssistant:')['input_ids'])
    ids = tokenizer('User: Name a color.\nAssistant:')['input_ids']
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, seed=2)
    assert by_ids.usage.prompt_tokens == len(ids)
    for prompt in (['Hello', 'Name a color.'], [ids, ids[:3]]):
        many = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, n=2, seed=3)
        assert [c.index for c in many.choices] == [0, 1, 2, 3]
        texts = {i: '' for i in range(4)}
        with client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, n=2, seed=3, stream=True) as s:
            for chunk in s:
                for c in chunk.choices:
                    texts[c.index] += c.text
        assert texts == {c.index: c.text for c in many.choices}
    assert many.usage.prompt_tokens == len(ids) + 3


def test_completion_logprobs_shape(client):
    r = client.completions.create(model=MODEL, prompt='The sky is', max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    n = len(lp.tokens)
    assert 1 <= n <= 5 and len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs) == n
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 2 and logprob <= 0
        assert max(top.values()) == pytest.approx(logprob, abs=1e-6)  # greedy: the sampled token is the top one
        assert token in top


# ---- tools --------------------------------------------------------------------------------------------------------
def test_tool_call_round_trip_with_a_trained_adapter(client, tool_adapter, tokenizer):
    base = client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=24)
    assert base.choices[0].message.tool_calls is None  # the base model does not call the tool

    for model in (tool_adapter, f'{MODEL}:oa-tool-caller'):  # the checkpoint by its path and by its alias
        r = client.chat.completions.create(model=model, messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=48)
        choice = r.choices[0]
        assert choice.finish_reason == 'tool_calls', choice
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        assert call.type == 'function' and call.id.startswith('call_')
        assert call.function.name == 'get_weather' and json.loads(call.function.arguments) == {'city': 'Paris'}

    # a named tool_choice writes the start of that call into the prompt; the adapter completes it
    named = client.chat.completions.create(
        model=tool_adapter,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice={'type': 'function', 'function': {'name': 'get_weather'}},
        temperature=0,
        max_tokens=48,
    ).choices[0]
    assert named.finish_reason == 'tool_calls' and named.message.tool_calls[0].function.name == 'get_weather'
    assert json.loads(named.message.tool_calls[0].function.arguments) == {'city': 'Paris'}

    streamed_calls, finish = [], None
    with client.chat.completions.create(
        model=tool_adapter, messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=48, stream=True
    ) as stream:
        for chunk in stream:
            for c in chunk.choices:
                streamed_calls += c.delta.tool_calls or []
                finish = c.finish_reason or finish
    assert finish == 'tool_calls' and [c.function.name for c in streamed_calls] == ['get_weather']
    assert json.loads(streamed_calls[0].function.arguments) == {'city': 'Paris'}

    # the round trip: the call and its result go back; the server renders both (and the tools) into the prompt
    follow_up = QUESTION + [
        {'role': 'assistant', 'content': None, 'tool_calls': [call.model_dump()]},
        {'role': 'tool', 'tool_call_id': call.id, 'content': RESULT},
    ]
    r = client.chat.completions.create(model=tool_adapter, messages=follow_up, tools=TOOLS, temperature=0, max_tokens=4)
    assert r.choices[0].finish_reason in ('stop', 'length', 'tool_calls')
    rendered = ChatRenderer(tokenizer).render(request(messages=follow_up, tools=TOOLS)).text
    assert json.dumps(TOOLS[0]) in rendered and CALL_TEXT in rendered
    assert f'<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>' in rendered
    assert r.usage.prompt_tokens == len(tokenizer(rendered, add_special_tokens=False)['input_ids'])


# ---- checkpoints and tenants --------------------------------------------------------------------------------------
def test_another_tenants_checkpoint_is_model_not_found(bob_client, tool_adapter):
    for model in (tool_adapter, f'{MODEL}:oa-tool-caller'):
        with pytest.raises(openai.NotFoundError) as err:
            bob_client.chat.completions.create(model=model, messages=HELLO, max_tokens=2)
        assert err.value.code == 'model_not_found' and err.value.param == 'model'
        assert err.value.body['type'] == 'invalid_request_error'
        with pytest.raises(openai.NotFoundError):
            bob_client.completions.create(model=model, prompt='x', max_tokens=2)
    with pytest.raises(openai.NotFoundError) as err:
        bob_client.models.retrieve(tool_adapter)
    assert err.value.code == 'model_not_found'


# ---- errors -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ('extra', 'param'),
    [
        ({'temperature': 5}, 'temperature'),
        ({'top_p': 0}, 'top_p'),
        ({'max_tokens': 0}, 'max_tokens'),
        ({'max_tokens': 4097}, 'max_tokens'),  # the tenant's max_sample_tokens
        ({'max_tokens': 2048}, 'max_tokens'),  # the model's context
        ({'n': 65}, 'n'),  # the tenant's max_num_samples
        ({'logprobs': True, 'top_logprobs': 21}, 'top_logprobs'),
        ({'top_logprobs': 2}, 'top_logprobs'),
        ({'frequency_penalty': 0.5}, 'frequency_penalty'),
        ({'logit_bias': {'5': 1.0}}, 'logit_bias'),
        ({'response_format': {'type': 'json_object'}}, 'response_format'),
        ({'stop': [''] * 2}, 'stop'),
        ({'tool_choice': 'required'}, 'tool_choice'),
        ({'messages': []}, 'messages'),
        ({'messages': [{'role': 'user', 'content': [{'type': 'image_url', 'image_url': {'url': 'x'}}]}]}, None),
        ({'temperature': 'hot'}, 'temperature'),
    ],
)
def test_bad_chat_requests_are_400_naming_the_field(client, extra, param):
    body = {'model': MODEL, 'messages': HELLO, 'max_tokens': 2, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**body)
    assert err.value.status_code == 400 and err.value.body['type'] == 'invalid_request_error'
    assert set(err.value.body) == {'message', 'type', 'param', 'code'} and err.value.body['message']
    if param is not None:
        assert err.value.param == param, err.value.body
    else:
        assert 'messages' in err.value.param


def test_bad_completion_requests_are_400(client):
    for extra in ({'echo': True}, {'prompt': [[]]}, {'prompt': [10**9]}, {'best_of': 3}, {'logprobs': 99}):
        with pytest.raises(openai.BadRequestError):
            client.completions.create(**{'model': MODEL, 'prompt': 'x', 'max_tokens': 2, **extra})


def test_authentication_and_unknown_models(server, client):
    with pytest.raises(openai.AuthenticationError) as err:
        openai_client(server, 'tml-not-a-real-key-at-all').models.list()
    assert err.value.code == 'invalid_api_key' and 'Authorization: Bearer' in err.value.message
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model='gpt-9', messages=HELLO, max_tokens=2)
    assert missing.value.code == 'model_not_found'
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model='tinker://nope/sampler_weights/x', messages=HELLO, max_tokens=2)


def test_rate_limits_are_429_in_openai_shape(server):
    from twinkle_server import TenantLimits

    server.service.config.tenant_limits['oa-carol'] = TenantLimits().merged({'requests_per_minute': 2})
    with openai_client(server, server.key('oa-carol')) as carol:
        carol.models.list()
        carol.models.list()
        with pytest.raises(openai.RateLimitError) as err:
            carol.models.list()
    assert err.value.code == 'rate_limit_exceeded' and err.value.response.headers.get('retry-after')
    # the sampling queue's per-tenant cap (max_pending_futures) applies as on the Tinker routes
    server.service.config.tenant_limits['oa-dave'] = TenantLimits().merged({'max_pending_futures': 0})
    with openai_client(server, server.key('oa-dave')) as dave:
        with pytest.raises(openai.RateLimitError) as err:
            dave.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert 'max_pending_futures' in err.value.message and err.value.body['type'] == 'rate_limit_error'


def test_raw_http_errors_have_openai_shape(server, alice):
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        cases = [
            (http.get('/v1/models'), 401),
            (http.get('/v1/chat/completions', headers={'Authorization': f'Bearer {alice}'}), 405),
            (http.post('/v1/embeddings', headers={'Authorization': f'Bearer {alice}'}, json={}), 404),
            (http.post('/v1/chat/completions', headers={'Authorization': f'Bearer {alice}'}, content=b'{nope'), 400),
            (http.post('/v1/completions', headers={'X-API-Key': alice}, json=[1, 2]), 400),
        ]
    for r, status in cases:
        assert r.status_code == status, r.text
        error = r.json()['error']
        assert set(error) == {'message', 'type', 'param', 'code'} and error['message'], error
        assert r.headers['x-should-retry'] == 'false'
