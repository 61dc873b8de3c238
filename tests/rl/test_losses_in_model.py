"""RL losses inside a real TransformersModel: rows -> input processor (padded or packed) -> loss."""

from __future__ import annotations

import math

import pytest

pytest.importorskip('twinkle_transformers')
from twinkle_core.model import TransformersModel  # noqa: E402


def rows_with_completions(tokenizer, n: int = 4) -> list[dict]:
    rows = []
    for i in range(n):
        prompt = tokenizer(f'Question {i}: what is {i}+{i}?', add_special_tokens=False)['input_ids']
        completion = tokenizer(f' The answer is {2 * i}.' + ' so' * i, add_special_tokens=False)['input_ids']
        rows.append({'input_ids': prompt + completion, 'labels': [-100] * len(prompt) + completion})
    return rows


@pytest.fixture(scope='module')
def model(tiny_model_dir):
    return TransformersModel(model_id=tiny_model_dir)


def current_logprobs(model, rows) -> list[list[float]]:
    """Per-row log-probs aligned with input_ids (forward_only also runs the loss, so use one these rows satisfy)."""
    model.set_loss('CrossEntropyLoss')
    return model.forward_only(inputs=rows)['logprobs']


def test_grpo_on_policy_rows_have_ratio_one_and_loss_minus_mean_advantage(model):
    """old_logps taken from forward_only line up with the training forward: every ratio is 1, so the GRPO loss is
    -mean(advantage) exactly -- a one-position misalignment of per-token fields would break both."""
    rows = rows_with_completions(model.tokenizer)
    for row, logps in zip(rows, current_logprobs(model, rows)):
        row['old_logps'] = logps
    advantages = [1.0, -0.5, 0.25, -2.0]
    for row, advantage in zip(rows, advantages):
        row['advantage'] = advantage
    model.set_loss('GRPOLoss', beta=0.0)
    result = model.forward_backward(inputs=rows)
    model.zero_grad()
    assert math.isclose(result['metrics']['ratio_mean'], 1.0, abs_tol=1e-5)
    assert result['metrics']['clip_frac'] == 0.0
    assert math.isclose(result['loss'], -sum(advantages) / len(advantages), rel_tol=1e-5)


@pytest.mark.parametrize(
    'loss, kwargs',
    [
        ('GRPOLoss', {'beta': 0.1}),
        ('DPOLoss', {}),
        ('ppo', {}),
        ('GSPOLoss', {'epsilon': 0.2, 'epsilon_high': 0.3}),
        ('ORPOLoss', {}),
        ('CPOLoss', {'loss_type': 'simpo'}),
        ('KTOLoss', {}),
    ],
)
def test_padded_and_packed_batches_give_the_same_loss(model, loss, kwargs):
    rows = rows_with_completions(model.tokenizer)
    for i, (row, logps) in enumerate(zip(rows, current_logprobs(model, rows))):
        row['old_logps'] = [x - 0.1 * ((i + t) % 3) for t, x in enumerate(logps)]  # ratios away from 1
        row['ref_logps'] = [x + 0.05 * ((i * t) % 5) for t, x in enumerate(logps)]
        row['advantages'] = [(-1.0) ** (i + t) * 0.5 for t in range(len(logps))]
        row['kto_label'] = (1, 0, -1, 1)[i]  # desirable, undesirable, a KL row
    model.set_loss(loss, **kwargs)
    model.set_processor('CausalLMProcessor', padding_free=False)
    padded = model.forward_only(inputs=rows)
    model.set_processor('CausalLMProcessor', padding_free=True)
    packed = model.forward_only(inputs=rows)
    model.set_processor('CausalLMProcessor', padding_free=False)
    assert math.isclose(padded['loss'], packed['loss'], rel_tol=1e-4, abs_tol=1e-6)
    for name, value in padded['metrics'].items():
        assert math.isclose(value, packed['metrics'][name], rel_tol=1e-4, abs_tol=1e-6), name
