"""`CalculatorCallTask` (kind ``task``): the calculator task's first turn scored for tool use -- a well-formed call
(the tool-call rate) with an expression of the right value, or the right number at once -- from a local sampler's
text or an endpoint's parsed ``tool_calls``; and evaluated by name through a real sampler with the tool offered."""

from __future__ import annotations

import json

import pytest

from twinkle_agentic.envs import arith
from twinkle_agentic.tasks import CalculatorCallTask
from twinkle_core.eval import evaluate
from twinkle_core.registry import resolve


@pytest.fixture(scope='module')
def task() -> CalculatorCallTask:
    return CalculatorCallTask(size=4, seed=7)


def answered(prompt: dict, message: dict) -> dict:
    return {**prompt, 'messages': [*prompt['messages'], {'role': 'assistant', **message}]}


def call_text(expression: str, name: str = 'calculator') -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": {"expression": expression}})}\n</tool_call>'


def test_prompts_offer_the_calculator_and_are_seeded(task):
    prompts = task.prompts()
    assert len(prompts) == 4 and prompts == CalculatorCallTask(size=4, seed=7).prompts()
    assert prompts != CalculatorCallTask(size=4, seed=8).prompts()
    for p in prompts:
        assert [t['function']['name'] for t in p['tools']] == ['calculator']
        assert p['user_data']['expression'] in p['messages'][0]['content']
        assert p['ground_truth'] == arith.format_number(arith.evaluate(p['user_data']['expression']))


def test_scores_a_call_a_direct_answer_and_their_mistakes(task):
    p = task.prompts()[0]
    expression, value = p['user_data']['expression'], p['ground_truth']
    cases = {
        'a call of the expression': ({'content': call_text(expression)}, (True, True)),
        'a call of an equal expression': ({'content': call_text(f'({expression}) + 0')}, (True, True)),
        'a call of another expression': ({'content': call_text('2 * 3')}, (False, True)),
        'a call of another tool': ({'content': call_text(expression, 'python')}, (False, False)),
        'an unclosed call': ({'content': call_text(expression)[:-12]}, (False, False)),
        'the right number at once': ({'content': f'The answer is {value}.'}, (True, False)),
        'a wrong number at once': ({'content': '42'}, (False, False)),
        "an endpoint's parsed call": (
            {
                'content': '',
                'tool_calls': [
                    {
                        'id': 'call_0',
                        'type': 'function',
                        'function': {'name': 'calculator', 'arguments': json.dumps({'expression': expression})},
                    }
                ],
            },
            (True, True),
        ),
    }
    for name, (message, expected) in cases.items():
        (score,) = task.score([answered(p, message)])
        assert (score.correct, score.formatted) == expected, name
        assert score.reward == float(expected[0])


def test_evaluated_by_name_through_a_local_sampler_with_the_tool_rendered(tiny_model_dir):
    from twinkle_transformers.sampler import TorchSampler

    sampler = TorchSampler(tiny_model_dir, device='cpu')
    result = evaluate(sampler, 'CalculatorCallTask', task_args={'size': 3, 'max_tokens': 8}, progress=False)
    assert result.task == 'calculator_call' and result.metrics['prompts'] == 3
    assert 0.0 <= result.metrics['format_rate'] <= 1.0 and len(result.records) == 3
    template = resolve('template', 'Template', model_id_or_tokenizer=str(tiny_model_dir))
    rendered = template.encode(CalculatorCallTask(size=1).prompts()[0], add_generation_prompt=True)
    assert 'calculator' in template.decode(rendered['input_ids'])  # the prompt the model saw offers the tool
