"""Accuracy and format rewards on example completions."""

from __future__ import annotations

import pytest

from twinkle_core.errors import InvalidInputError
from twinkle_core.registry import resolve
from twinkle_core.reward.accuracy import GSM8KAccuracyReward, MathAccuracyReward
from twinkle_core.reward.answers import answers_match, extract_boxed, parse_number
from twinkle_core.reward.format import FormatReward, GSM8KFormatReward
from twinkle_core.types import Trajectory


def traj(completion: str, **fields) -> dict:
    return {'messages': [{'role': 'user', 'content': 'q?'}, {'role': 'assistant', 'content': completion}], **fields}


def test_gsm8k_accuracy_reads_answer_tags_markers_boxes_and_last_numbers():
    reward = GSM8KAccuracyReward()
    gt = {'answer': 'Natalia sold 48/2 = 24 clips in May.\n#### 72'}  # the raw GSM8K solution field
    completions = [
        '<think>48 + 24</think><answer>72</answer>',  # answer tag
        'so she sold 48+24 = 72 clips.\n#### 72',  # GSM8K marker
        'The total is \\boxed{72}.',  # boxed
        'First 48, then 24, in total 72 clips',  # last number
        '<answer>The answer is 72.</answer>',  # number inside the tag
        'It is 1,072 or so... #### 1,072',  # wrong, with thousands separator
        '<answer>71</answer> but 72 later',  # the tag wins over later numbers
        'no idea',
    ]
    assert reward([traj(c, **gt) for c in completions]) == [1, 1, 1, 1, 1, 0, 0, 0]
    assert reward([traj('#### 1,200', ground_truth='1200')]) == [1.0]


def test_math_accuracy_numeric_equivalence_and_boxed_references():
    reward = MathAccuracyReward()
    cases = [
        ('So x = \\boxed{\\frac{1}{2}}', '0.5', 1.0),
        ('\\boxed{0.50}', '\\frac{1}{2}', 1.0),
        ('\\boxed{3/4}', '\\dfrac{3}{4}', 1.0),
        ('\\boxed{\\frac{3}{4}}', '0.7', 0.0),
        ('it equals 1000', '1,000', 1.0),
        ('\\boxed{x^{2}+1}', 'The solution gives \\boxed{x^{2} + 1}.', 1.0),  # MATH-style reference, non-numeric
        ('\\boxed{\\text{(B)}}', '(B)', 1.0),
        ('\\boxed{-5}', '5', 0.0),
        ('\\boxed{50\\%}', '50', 1.0),
        ('nothing to see', '3', 0.0),
    ]
    got = reward([traj(c, ground_truth=gt) for c, gt, _ in cases])
    assert got == [want for _, _, want in cases]
    assert MathAccuracyReward(boxed_only=True)([traj('the answer is 3', ground_truth='3')]) == [0.0]


def test_answer_helpers():
    assert extract_boxed('a \\boxed{\\frac{1}{\\sqrt{2}}} b \\boxed{7}') == '7'
    assert extract_boxed('\\boxed{\\frac{1}{\\sqrt{2}}}') == '\\frac{1}{\\sqrt{2}}'
    assert extract_boxed('\\boxed{unbalanced') is None
    assert parse_number('$1,234.50$') == parse_number('1234.5')
    assert parse_number('1/0') is None and parse_number('abc') is None
    assert answers_match('2.0000001', '2') and not answers_match(None, '2')


def test_format_rewards():
    fmt = FormatReward()
    gsm8k = GSM8KFormatReward()
    completions = [
        '<think>because</think>\n<answer>42</answer>',
        '<answer>42</answer>',
        '<think>x</think><answer>forty two</answer>',
        'text <think>x</think><answer>4</answer>',
    ]
    trajectories = [traj(c) for c in completions]
    assert fmt(trajectories) == [1.0, 0.0, 1.0, 0.0]
    assert gsm8k(trajectories) == [1.0, 0.0, 0.0, 0.0]
    assert FormatReward(think_tag=None)(trajectories) == [0.0, 1.0, 0.0, 0.0]
    assert FormatReward(r'#### -?\d+')([traj('#### 12'), traj('#### twelve')]) == [1.0, 0.0]
    with pytest.raises(InvalidInputError, match='invalid regex'):
        FormatReward('(')


def test_rewards_accept_trajectory_models_and_resolve_by_name():
    model = Trajectory.model_validate(traj('\\boxed{4}', ground_truth='4'))
    assert resolve('reward', 'MathAccuracyReward')([model]) == [1.0]
    assert resolve('reward', 'GSM8KFormatReward')([traj('<think>a</think><answer>4</answer>')]) == [1.0]


def test_reward_input_errors_name_the_trajectory():
    with pytest.raises(InvalidInputError, match='trajectory 1 has none of the ground-truth fields'):
        MathAccuracyReward()([traj('1', answer='1'), traj('1')])
    prompt_only = {'messages': [{'role': 'user', 'content': 'q?'}], 'ground_truth': '1'}
    with pytest.raises(InvalidInputError, match="last message of trajectory 0 has role 'user'"):
        GSM8KAccuracyReward()([prompt_only])
    assert MathAccuracyReward(answer_fields=['label'])([traj('\\boxed{2}', label=2)]) == [1.0]
