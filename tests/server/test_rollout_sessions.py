"""Rollout sessions on `/v1`, through the unmodified `openai` client (an agent that only knows a base URL): every call
is recorded as tokens, calls that extend each other join one token-exact episode, a rewritten history starts a new
segment (reported), rewards and episodes come back as training rows, sessions are tenant-owned and capped."""

from __future__ import annotations

import math

import pytest

from tests.server.server_names import MODEL, openai_client

QUESTION = [{'role': 'user', 'content': 'What is the weather in Paris?'}]


def open_session(client, **caps) -> dict:
    return client.post('/rollouts', body={'model': MODEL, **caps}, cast_to=object)


def episodes(client, session) -> dict:
    return client.get(f'/rollouts/{session["id"]}/episodes', cast_to=object)


@pytest.fixture(scope='module')
def agent_turns(server, alice):
    """A three-call agent conversation in a session through the session's base URL: ask, answer, follow up; then a
    call that rewrites the history (its first answer replaced)."""
    with openai_client(server, alice) as client:
        session = open_session(client)
        agent = openai_client(server, alice)
        agent.base_url = f'{server.base_url}{session["base_url"]}'
        messages = list(QUESTION)
        replies = []
        for turn in range(3):
            reply = agent.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=6, temperature=1.0, seed=turn
            )
            replies.append(reply)
            messages += [
                {'role': 'assistant', 'content': reply.choices[0].message.content},
                {'role': 'user', 'content': f'And tomorrow ({turn})?'},
            ]
        rewritten = [
            QUESTION[0],
            {'role': 'assistant', 'content': 'It is sunny.'},
            {'role': 'user', 'content': 'Sure?'},
        ]
        agent.chat.completions.create(model=MODEL, messages=rewritten, max_tokens=4, temperature=1.0, seed=9)
        agent.close()
        yield client, session, replies, episodes(client, session)


def test_calls_that_extend_each_other_are_one_token_exact_episode(agent_turns, tokenizer) -> None:
    client, session, replies, result = agent_turns
    assert result['calls'] == 4 and len(result['data']) == 2, result
    first, second = result['data']
    assert first['calls'] == [0, 1, 2] and first['segment'] == 0
    assert second['calls'] == [3] and second['segment'] == 1
    assert [s['call'] for s in result['splits']] == [3] and 'token for token' in result['splits'][0]['reason']
    # the sampled tokens: what each reply returned (its text), at their positions, with one log-prob each
    trained = [i for i, label in enumerate(first['labels']) if label != -100]
    assert len(trained) == len(first['logprobs']) and all(lp <= 0 for lp in first['logprobs'])
    sampled = [first['input_ids'][i] for i in trained]
    text = tokenizer.decode(sampled, skip_special_tokens=True)
    for reply in replies:
        assert reply.choices[0].message.content in text
    # the inserted tokens (the user turns and template glue) are not trained
    assert 'And tomorrow (1)?' in tokenizer.decode(first['input_ids'])
    assert 'And tomorrow (1)?' not in text


def test_a_grpo_step_on_the_episodes_is_on_policy(server, alice, service_client) -> None:
    """The policy is a tinker sampler checkpoint; two sessions (a group) of a two-call agent sample it; their
    episodes, rewarded, become tinker Datums (`episode_datum`); the learner (the same weights) scores every sampled
    token as the session recorded it (ratio 1, 1e-3) and one optimizer step moves the policy."""
    import numpy as np
    from tinker import types

    from twinkle_agentic.rollout import episode_datum

    training = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=0).result()
    policy = training.save_weights_for_sampler(name='rollout-policy-0').result().path
    rows = []
    with openai_client(server, alice) as client:
        for g in range(2):
            session = client.post('/rollouts', body={'model': policy}, cast_to=object)
            with openai_client(server, alice) as agent:
                agent.base_url = f'{server.base_url}{session["base_url"]}'
                messages = list(QUESTION)
                for turn in range(2):
                    reply = agent.chat.completions.create(
                        model=policy, messages=messages, max_tokens=5, seed=10 * g + turn
                    )
                    messages += [{'role': 'assistant', 'content': reply.choices[0].message.content}]
                    messages += [{'role': 'user', 'content': 'Go on.'}]
            client.post(f'/rollouts/{session["id"]}/reward', body={'reward': float(g)}, cast_to=object)
            rows += episodes(client, session)['data']
    assert [len(r['calls']) for r in rows] == [2, 2] and [r['reward'] for r in rows] == [0.0, 1.0]
    mean = sum(r['reward'] for r in rows) / len(rows)
    data = [episode_datum(r, r['reward'] - mean) for r in rows]
    out = training.forward_backward(data, 'importance_sampling').result()
    for r, o in zip(rows, out.loss_fn_outputs):
        learner = o['logprobs'].to_numpy()[np.array(r['labels'][1:]) != -100]
        np.testing.assert_allclose(learner, r['logprobs'], atol=1e-3)  # ratio 1: on-policy
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = training.save_weights_and_get_sampling_client().result()
    moved = after.compute_logprobs(types.ModelInput.from_ints(rows[1]['input_ids'])).result()
    trained = [i for i, label in enumerate(rows[1]['labels']) if label != -100]
    assert max(abs(moved[i] - lp) for i, lp in zip(trained, rows[1]['logprobs'])) > 1e-3


def test_rewards_and_isolation(server, alice, bob) -> None:
    import openai

    with openai_client(server, alice) as client, openai_client(server, bob) as other:
        session = open_session(client, max_calls=2, ttl_s=600)
        assert session['max_calls'] == 2 and session['base_url'].endswith('/v1')
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=3, extra_headers={'X-Rollout-Session': session['id']}
        )
        client.chat.completions.create(
            model=MODEL, messages=QUESTION, max_tokens=3, n=2, extra_body={'rollout_session': session['id']}
        )
        with pytest.raises(openai.RateLimitError, match='max_calls=2'):
            client.chat.completions.create(
                model=MODEL, messages=QUESTION, max_tokens=3, extra_headers={'X-Rollout-Session': session['id']}
            )
        assert len(episodes(client, session)['data']) == 3  # two roots: one choice, then two
        with pytest.raises(openai.NotFoundError):
            episodes(other, session)  # another tenant's session does not exist for bob
        with pytest.raises(openai.BadRequestError, match='rewards has 2 numbers; the session has 3 episodes'):
            client.post(f'/rollouts/{session["id"]}/reward', body={'rewards': [1, 0]}, cast_to=object)
        client.post(f'/rollouts/{session["id"]}/reward', body={'rewards': [1, 0, 0.5]}, cast_to=object)
        assert [e['reward'] for e in episodes(client, session)['data']] == [1.0, 0.0, 0.5]
        with pytest.raises(openai.BadRequestError, match='pinned'):
            client.post(
                f'/rollouts/{session["id"]}/v1/chat/completions',
                body={'model': 'another', 'messages': QUESTION},
                cast_to=object,
            )
        client.delete(f'/rollouts/{session["id"]}', cast_to=object)
        with pytest.raises(openai.NotFoundError):
            episodes(client, session)
        assert math.isfinite(session['expires_at'] - session['created_at'])


def test_a_tool_calling_agent_is_one_episode(server, alice, tool_adapter, tokenizer) -> None:
    """A plain openai-SDK tool loop (call the model, run the tool, send the result back; the second call streamed):
    the tool call the agent sends back -- re-serialised by the SDK -- is matched to what was sampled, so both calls
    join one episode in which the sampled call text is trained and the tool's result is not."""
    from tests.server.openai_tools import TOOLS

    with openai_client(server, alice) as client:
        session = client.post('/rollouts', body={'model': tool_adapter}, cast_to=object)
        with openai_client(server, alice) as agent:
            agent.base_url = f'{server.base_url}{session["base_url"]}'
            messages = list(QUESTION)
            reply = agent.chat.completions.create(model=tool_adapter, messages=messages, tools=TOOLS, temperature=0.0)
            call = reply.choices[0].message.tool_calls[0]
            assert call.function.name == 'get_weather'
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append({'role': 'tool', 'tool_call_id': call.id, 'content': '18 C and sunny'})
            stream = agent.chat.completions.create(
                model=tool_adapter, messages=messages, tools=TOOLS, max_tokens=5, stream=True
            )
            streamed = ''.join(chunk.choices[0].delta.content or '' for chunk in stream if chunk.choices)
        result = episodes(client, session)
    assert result['splits'] == [] and len(result['data']) == 1, result
    episode = result['data'][0]
    assert episode['calls'] == [0, 1]
    sampled = [t for t, label in zip(episode['input_ids'], episode['labels']) if label != -100]
    text = tokenizer.decode(sampled, skip_special_tokens=False)
    assert '"get_weather"' in text and '18 C and sunny' not in text
    assert '18 C and sunny' in tokenizer.decode(episode['input_ids'])
    assert streamed in tokenizer.decode(sampled, skip_special_tokens=True)


def test_caps_ttl_and_concurrent_agents(server, alice) -> None:
    """Two agents talk in one session at the same time: each conversation is its own episode. A session past its
    token cap refuses calls; one past its lifetime is gone (404), and the reaper deletes it."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import openai

    with openai_client(server, alice) as client:
        session = open_session(client)

        def converse(name: str) -> None:
            with openai_client(server, alice) as agent:
                agent.base_url = f'{server.base_url}{session["base_url"]}'
                messages = [{'role': 'user', 'content': f'I am {name}. Hello!'}]
                for turn in range(3):
                    reply = agent.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, seed=turn)
                    messages += [
                        {'role': 'assistant', 'content': reply.choices[0].message.content},
                        {'role': 'user', 'content': f'{name} again'},
                    ]

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(converse, ['Ann', 'Bo']))
        result = episodes(client, session)
        assert sorted(len(e['calls']) for e in result['data']) == [3, 3], result
        assert len({e['segment'] for e in result['data']}) == 2  # two conversations, neither split

        small = open_session(client, max_tokens=10, ttl_s=1)
        call = dict(model=MODEL, messages=QUESTION, max_tokens=4, extra_headers={'X-Rollout-Session': small['id']})
        client.chat.completions.create(**call)  # allowed (nothing used yet); its prompt alone is over 10 tokens
        with pytest.raises(openai.RateLimitError, match='max_tokens=10'):
            client.chat.completions.create(**call)
        time.sleep(1.1)
        with pytest.raises(openai.NotFoundError):
            client.get(f'/rollouts/{small["id"]}', cast_to=object)
        assert small['id'] in server.service.store.expired_rollouts(time.time())
        assert server.service.rollouts.reap() >= 1
        assert small['id'] not in server.service.store.expired_rollouts(time.time())


def two_call_harness(api_key: str):
    """An agent harness as `RolloutSessions` takes it: an unmodified two-call `openai` agent pointed at the session's
    base URL, scored by the task (here the task *is* the reward, so the group's rewards differ)."""
    import openai

    def harness(base_url: str, policy: str, task: dict) -> float:
        if task.get('crash'):
            raise RuntimeError('the agent crashed')
        with openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0) as agent:
            messages = list(QUESTION)
            for turn in range(2):
                reply = agent.chat.completions.create(model=policy, messages=messages, max_tokens=4, seed=turn)
                messages += [{'role': 'assistant', 'content': reply.choices[0].message.content}]
                messages += [{'role': 'user', 'content': 'Go on.'}]
        return task['reward']

    return harness


def test_rollout_sessions_and_a_native_client_grpo_step(server, alice) -> None:
    """`twinkle_client.RolloutSessions` runs the agent G times per task, each run in its own session of a native
    client checkpoint (`model.save`'s twinkle:// path); each run's episode carries its reward and the session is
    deleted. The episodes train through the native client with `GRPOLoss` and the sampler's log-probs: the learner
    scores every sampled token as recorded (ratio 1, 1e-3) and the step moves the policy. A crashing agent scores
    `failure_reward` (or, without one, stops the run naming its task)."""
    import numpy as np

    from twinkle_client import MultiLoraTransformersModel, RemoteInputError, RolloutSessions, TwinkleClient
    from twinkle_core.errors import TwinkleError

    native = TwinkleClient(server.base_url, alice)
    model = MultiLoraTransformersModel(model_id=MODEL, client=native)
    model.add_adapter_to_model('agent', {'r': 8, 'lora_alpha': 16, 'seed': 0})
    model.set_optimizer('AdamW', lr=1e-2)
    model.set_loss('GRPOLoss')
    policy = model.save('session-policy-0')
    tasks = [{'reward': 1.0}, {'reward': 0.0}]
    with RolloutSessions(server.base_url, alice, concurrency=2) as sessions:
        groups = sessions.run(policy, two_call_harness(alice), tasks, group_size=2, progress=False)
        assert [[run.reward for run in group] for group in groups] == [[1.0, 1.0], [0.0, 0.0]]
        runs = [run for group in groups for run in group]
        assert all(len(run.episodes) == 1 and run.splits == [] and run.error is None for run in runs)
        assert [run.episodes[0]['reward'] for run in runs] == [1.0, 1.0, 0.0, 0.0]
        with openai_client(server, alice) as client, pytest.raises(Exception, match='not found|404'):
            client.get(f'/rollouts/{runs[0].session_id}', cast_to=object)  # deleted once read

        with pytest.raises(TwinkleError, match="task {'crash': True}: RuntimeError"):
            sessions.run(policy, two_call_harness(alice), [{'crash': True}], progress=False)
        sessions.failure_reward = -1.0
        [[crashed]] = sessions.run(policy, two_call_harness(alice), [{'crash': True}], progress=False)
        assert crashed.reward == -1.0 and 'the agent crashed' in crashed.error and crashed.episodes == []
    with RolloutSessions(server.base_url, alice, max_calls=1, failure_reward=-1.0) as capped:  # caps reach sessions
        [[over]] = capped.run(policy, two_call_harness(alice), [{'reward': 1.0}], progress=False)
        assert over.reward == -1.0 and 'max_calls=1' in over.error and len(over.episodes) == 1
    with RolloutSessions(server.base_url, alice, ttl_s=0) as wrong, pytest.raises(RemoteInputError, match='ttl_s'):
        wrong.run(policy, two_call_harness(alice), [{'reward': 1.0}], progress=False)

    rows = [run.episodes[0] for run in runs]
    advantages = [run.reward - 0.5 for run in runs]
    inputs = [{'input_ids': r['input_ids'], 'labels': r['labels']} for r in rows]
    out = model.forward_backward(inputs=inputs, advantages=advantages, old_logps=[r['logprobs'] for r in rows])
    for r, learner in zip(rows, out['logprobs']):
        trained = np.array(r['labels']) != -100  # the learner's log-probs are aligned with input_ids
        np.testing.assert_allclose(np.array(learner)[trained], r['logprobs'], atol=1e-3)  # ratio 1: on-policy
    model.clip_grad_and_step()
    after = model.forward_only(inputs=inputs[:1], compute_loss=False)['logprobs'][0]
    trained = np.array(rows[0]['labels']) != -100
    assert np.abs(np.array(after)[trained] - rows[0]['logprobs']).max() > 1e-3
    native.close()
