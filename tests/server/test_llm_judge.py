"""`LLMJudgeReward` against this project's own `/v1` endpoint: the judge's scores are what its parser reads in the
replies the endpoint gives the same requests (checked through the `openai` client), unparseable replies are counted
and get the stated default, identical requests are asked once, timeouts and an unreachable endpoint are counted."""

from __future__ import annotations

import pytest
from server_names import MODEL, openai_client

from twinkle_core.reward.judge import LLMJudgeReward, parse_score
from twinkle_core.utils.net import free_port


def trajectories() -> list[dict]:
    answers = ['The answer is 4.', 'Four.', 'I do not know.', 'The answer is 4.']  # the last repeats the first
    return [
        {'messages': [{'role': 'user', 'content': 'What is 2 + 2?'}, {'role': 'assistant', 'content': a}]}
        for a in answers
    ]


def test_scores_are_the_parsed_replies_of_the_endpoint_and_invalid_ones_are_counted(server, alice):
    judge = LLMJudgeReward(
        base_url=f'{server.base_url}/v1', model=MODEL, api_key=alice, invalid_score=-1.0, max_tokens=12
    )
    items = trajectories()
    scores = judge(items)
    assert judge.stats.requests == 3 and judge.stats.cache_hits == 1  # the repeated request was asked once
    with openai_client(server, alice) as client:
        replies = [
            client.chat.completions.create(model=MODEL, messages=judge.messages(t, i), temperature=0.0, max_tokens=12)
            .choices[0]
            .message.content
            for i, t in enumerate(items[:3])
        ]
    parsed = [parse_score(r or '', 0, 10) for r in replies]
    assert scores == [-1.0 if p is None else p for p in [*parsed, parsed[0]]]
    assert judge.stats.invalid == sum(p is None for p in parsed) and judge.stats.timeouts == judge.stats.errors == 0
    assert judge(items) == scores and judge.stats.requests == 3  # all from the cache now
    assert judge.metrics()['judge/cache_hits'] == 5


def test_timeouts_and_an_unreachable_endpoint_are_counted_not_raised(server, alice):
    slow = LLMJudgeReward(base_url=f'{server.base_url}/v1', model=MODEL, api_key=alice, timeout_s=1e-4)
    assert slow(trajectories()[:2]) == [0.0, 0.0] and slow.stats.timeouts == 2
    gone = LLMJudgeReward(base_url=f'http://127.0.0.1:{free_port()}/v1', model=MODEL, timeout_s=5)
    assert gone(trajectories()[:2]) == [0.0, 0.0] and gone.stats.errors == 2
    assert gone(trajectories()[:1]) == [0.0] and gone.stats.requests == 3  # a failed request is asked again


def test_a_wrong_key_is_an_error_counted_per_request(server):
    judge = LLMJudgeReward(base_url=f'{server.base_url}/v1', model=MODEL, api_key='tml-not-a-key')
    assert judge(trajectories()[:2]) == [0.0, 0.0] and judge.stats.errors == 2


@pytest.mark.parametrize(
    'reply, want',
    [
        ('Score: 7', 7.0),
        ('score = 8.5 because it is right', 8.5),
        ('Rating: **9**', 9.0),
        ('I would give it 6/10.', 6.0),
        ('6', 6.0),
        ('Score: 11', None),  # out of range
        ('between 3 and 5', None),  # two numbers, no marker
        ('excellent', None),
        ('Grade: -1', None),
    ],
)
def test_parse_score(reply, want):
    assert parse_score(reply, 0, 10) == want
