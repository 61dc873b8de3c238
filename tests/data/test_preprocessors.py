"""Built-in preprocessors on sample rows, and their errors for rows that lack fields."""

from __future__ import annotations

import json

import pytest

from twinkle_core import resolve
from twinkle_core.errors import InvalidInputError
from twinkle_core.preprocessor import Filter, LengthFilter, LossTokensFilter, MessageLengthFilter
from twinkle_core.types import Trajectory


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_self_cognition_fills_placeholders(samples):
    proc = resolve('preprocessor', 'SelfCognitionProcessor', model_name='Twinkle', model_author='ModelScope')
    for row in _rows(samples['self_cognition']):
        out = proc(row)
        Trajectory.model_validate(out)
        text = json.dumps(out)
        assert '{{NAME}}' not in text and '{{AUTHOR}}' not in text
        assert [m['role'] for m in out['messages']] == ['user', 'assistant']
        assert out['messages'][1]['content'] == row['response'].replace('{{NAME}}', 'Twinkle').replace(
            '{{AUTHOR}}', 'ModelScope'
        )


def test_alpaca_joins_instruction_and_input(samples):
    proc = resolve('preprocessor', 'AlpacaProcessor', system='Be brief.')
    rows = _rows(samples['alpaca'])
    with_input = next(r for r in rows if r['input'])
    without = next(r for r in rows if not r['input'])
    out = proc(with_input)
    assert [m['role'] for m in out['messages']] == ['system', 'user', 'assistant']
    assert out['messages'][1]['content'] == f'{with_input["instruction"]}\n\n{with_input["input"]}'
    assert out['messages'][2]['content'] == with_input['output']
    assert proc(without)['messages'][1]['content'] == without['instruction']


def test_sharegpt_and_messages_rows(samples):
    proc = resolve('preprocessor', 'MessagesProcessor')
    for row in _rows(samples['sharegpt']):
        out = proc(row)
        Trajectory.model_validate(out)
        assert [m['content'] for m in out['messages']] == [t['value'] for t in row['conversations']]
        assert out['messages'][-1]['role'] == 'assistant'
    openai_style = {
        'messages': [{'role': 'user', 'content': 'q'}, {'role': 'assistant', 'content': 'a', 'loss': False}],
        'system': 'S',
    }
    out = proc(openai_style)
    assert out['messages'][0] == {'role': 'system', 'content': 'S'}
    assert out['messages'][2]['loss'] is False


def test_gsm8k_keeps_ground_truth(samples):
    proc = resolve('preprocessor', 'GSM8KProcessor')
    rows = _rows(samples['gsm8k'])
    for row in rows:
        out = proc(row)
        expected = row['answer'].rsplit('####', 1)[1].strip().replace(',', '')
        assert out['ground_truth'] == expected
        assert '####' in out['messages'][0]['content'] and out['messages'][0]['role'] == 'system'
        assert out['messages'][1]['content'] == row['question']
    assert any(',' in r['answer'].rsplit('####', 1)[1] for r in rows)  # the sample exercises comma removal


@pytest.mark.parametrize(
    'name, init_args, row, missing',
    [
        ('SelfCognitionProcessor', {'model_name': 'a', 'model_author': 'b'}, {'query': 'hi'}, ["'response'"]),
        ('AlpacaProcessor', {}, {'input': 'x'}, ["'instruction'", "'output'"]),
        ('GSM8KProcessor', {}, {'question': 'What is 1+1?'}, ["'answer'"]),
        ('MessagesProcessor', {}, {'text': 'hello'}, ["'messages'", "'conversations'"]),
    ],
)
def test_missing_fields_are_named(name, init_args, row, missing):
    proc = resolve('preprocessor', name, **init_args)
    with pytest.raises(InvalidInputError) as err:
        proc(row)
    for field in missing:
        assert field in str(err.value)
    assert name in str(err.value)


def test_bad_conversations_are_explained():
    proc = resolve('preprocessor', 'ShareGPTProcessor')
    with pytest.raises(InvalidInputError, match=r"turn 1 has unknown from 'robot'"):
        proc({'conversations': [{'from': 'human', 'value': 'hi'}, {'from': 'robot', 'value': 'beep'}]})
    with pytest.raises(InvalidInputError, match='turn 0 needs fields'):
        proc({'conversations': [{'from': 'human'}]})
    with pytest.raises(InvalidInputError, match="no final number after '####'"):
        resolve('preprocessor', 'GSM8KProcessor')({'question': 'q', 'answer': 'no marker'})


def test_callable_preprocessor_and_filters():
    proc = resolve(
        'preprocessor', lambda row, suffix: {'messages': [{'role': 'user', 'content': row['q'] + suffix}]}, suffix='?'
    )
    assert proc({'q': 'why'})['messages'][0]['content'] == 'why?'
    keep_short = Filter.from_callable(lambda row, limit: len(row['q']) <= limit, limit=3)
    assert keep_short({'q': 'abc'}) and not keep_short({'q': 'abcd'})
    assert LengthFilter(max_length=3)({'input_ids': [1, 2, 3]}) and not LengthFilter(max_length=2)(
        {'input_ids': [1, 2, 3]}
    )
    assert MessageLengthFilter(5)({'messages': [{'content': 'ab'}, {'content': 'cde'}]})
    with pytest.raises(InvalidInputError, match='after Dataset.encode'):
        LengthFilter(4)({'messages': []})
    assert LossTokensFilter()({'labels': [-100, 5]}) and not LossTokensFilter()({'labels': [-100, -100]})
    assert not LossTokensFilter(min_tokens=2)({'labels': [-100, 5]})
