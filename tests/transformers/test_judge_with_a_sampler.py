"""`LLMJudgeReward(sampler=...)`: the judge runs in process on any twinkle sampler (here `TorchSampler`), all
requests of a call in one batched `sample`; its scores are what `parse_score` reads in the sampler's own replies."""

from __future__ import annotations

import pytest

from twinkle_core.data_format import SamplingParams
from twinkle_core.errors import InvalidInputError
from twinkle_core.reward.judge import LLMJudgeReward, parse_score

pytest.importorskip('twinkle_transformers')


def test_a_sampler_judge_scores_what_it_replies(tiny_model_dir):
    from twinkle_transformers.sampler import TorchSampler

    sampler = TorchSampler(tiny_model_dir, device='cpu')
    sampler.set_template('Template')
    judge = LLMJudgeReward(sampler=sampler, invalid_score=-1.0, max_tokens=8, normalize=True)
    items = [
        {'messages': [{'role': 'user', 'content': f'Say {w}.'}, {'role': 'assistant', 'content': w}]}
        for w in ('yes', 'no', 'yes')
    ]
    scores = judge(items)
    replies = sampler.sample(
        [{'messages': judge.messages(t, i)} for i, t in enumerate(items)], SamplingParams(max_tokens=8, temperature=0.0)
    )
    parsed = [parse_score(r.sequences[0].text or '', 0, 10) for r in replies]
    assert scores == [-1.0 if p is None else p / 10 for p in parsed]
    assert judge.stats.requests == 2 and judge.stats.cache_hits == 1


def test_the_judge_must_be_named_once():
    with pytest.raises(InvalidInputError, match='exactly one judge'):
        LLMJudgeReward()
    with pytest.raises(InvalidInputError, match='needs model='):
        LLMJudgeReward(base_url='http://127.0.0.1:1/v1')
    with pytest.raises(InvalidInputError, match='min_score 5 must be below max_score 5'):
        LLMJudgeReward(base_url='http://127.0.0.1:1/v1', model='m', min_score=5, max_score=5)


def test_the_judge_reads_dict_and_model_trajectories_alike():
    from twinkle_core.data_format import Trajectory

    judge = LLMJudgeReward(base_url='http://127.0.0.1:1/v1', model='m', min_score=1, max_score=5)
    turns = [
        {'role': 'system', 'content': 'be brief'},
        {'role': 'user', 'content': 'hi'},
        {'role': 'assistant', 'content': 'yo'},
    ]
    as_dict, as_model = judge.messages({'messages': turns}, 0), judge.messages(Trajectory(messages=turns), 0)
    assert as_dict == as_model and as_dict[1]['content'] == 'REQUEST:\nhi\n\nRESPONSE:\nyo'
    assert '"Score: N"' in as_dict[0]['content'] and 'from 1 (worst) to 5 (best)' in as_dict[0]['content']
