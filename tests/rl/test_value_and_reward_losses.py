"""`PPOValueLoss`, `BradleyTerryLoss`, the k1/k2/k3 KL estimators and `ChosenRejectedProcessor`, against float64
references written from the published definitions (values AND gradients):

- ``trl/trainer/ppo_trainer.py`` (``vpredclipped = clamp(vpred, values - cliprange_value, values +
  cliprange_value)``; ``vf_loss = 0.5 * masked_mean(max((vpred - returns)^2, (vpredclipped - returns)^2))``) and
  OpenRLHF's ``openrlhf/models/loss.py`` (``ValueLoss``: the same with ``clip_eps``);
- ``trl/trainer/reward_trainer.py`` (``compute_loss``: ``-logsigmoid(rewards_chosen - rewards_rejected -
  margin).mean()`` + ``center_rewards_coefficient * mean((rewards_chosen + rewards_rejected)^2)``), the reward
  being the score head's output at the last token;
- Schulman's "Approximating KL Divergence" (k1, k2, k3).
"""

from __future__ import annotations

import random

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.kl import kl_estimate
from twinkle_core.loss.reward_model import BradleyTerryLoss
from twinkle_core.loss.value import PPOValueLoss
from twinkle_core.preprocessor.preference import ChosenRejectedProcessor
from twinkle_core.processor.causal_lm import CausalLMProcessor

ROWS = 6  # 3 (chosen, rejected) pairs


def rows(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(ROWS):
        prompt, completion = rng.randint(2, 5), rng.randint(2, 6)
        n = prompt + completion
        out.append(
            {
                'input_ids': [rng.randint(3, 50) for _ in range(n)],
                'labels': [-100] * prompt + [rng.randint(3, 50) for _ in range(completion)],
                'returns': [rng.gauss(0, 1) for _ in range(n)],
                'old_values': [rng.gauss(0, 1) for _ in range(n)],
                'margin': [0.5, 0.0, 1.0, 0.0, 0.25, 0.0][i],
            }
        )
    return out


def collate(row_list: list[dict], packed: bool) -> dict:
    return CausalLMProcessor(padding_free=packed)(row_list)


def values_for(batch: dict, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch['labels'].shape, generator=g, dtype=torch.float64).requires_grad_(True)


def ref_value_loss(row_list, batch, values, clip):
    """TRL / OpenRLHF on the unshifted rows: position t's value predicts the return of label t+1."""
    terms = []
    for b, row in enumerate(row_list):
        n = len(row['input_ids'])
        offset = 0 if not batch['packed'] else sum(len(r['input_ids']) for r in row_list[:b])
        v_row = values[0, offset : offset + n] if batch['packed'] else values[b, :n]
        for t in range(n - 1):
            if row['labels'][t + 1] == -100:
                continue
            v, ret, old = v_row[t], row['returns'][t + 1], row['old_values'][t + 1]
            loss = (v - ret) ** 2
            if clip is not None:
                clipped = torch.clamp(v, old - clip, old + clip)
                loss = torch.maximum(loss, (clipped - ret) ** 2)
            terms.append(0.5 * loss)
    return torch.stack(terms).mean()


@pytest.mark.parametrize('packed', [False, True])
@pytest.mark.parametrize('clip', [0.2, None])
def test_value_loss_matches_the_reference(packed, clip):
    row_list = rows()
    batch = collate(row_list, packed)
    values = values_for(batch)
    out = PPOValueLoss(clip_range=clip)(batch, {'values': values})
    expected = ref_value_loss(row_list, batch, values, clip)
    (grad,) = torch.autograd.grad(out['loss'], values)
    (expected_grad,) = torch.autograd.grad(expected, values)
    assert torch.allclose(out['loss'], expected, atol=1e-12)
    assert torch.allclose(grad, expected_grad, atol=1e-12)
    assert out['metrics']['value_loss'] == pytest.approx(float(expected.detach()))
    if clip is not None:
        assert 0 < out['metrics']['value_clipfrac'] < 1  # random values: some positions are clipped, some not


def test_explained_variance_is_one_for_perfect_values_and_about_zero_for_the_mean():
    row_list = rows()
    batch = collate(row_list, packed=False)
    returns = batch['returns'].double()
    perfect = PPOValueLoss(clip_range=None)(batch, {'values': returns.clone()})
    assert perfect['metrics']['explained_variance'] == pytest.approx(1.0)
    assert perfect['metrics']['value_loss'] == pytest.approx(0.0)
    mask = batch['labels'] != -100
    mean = torch.full_like(returns, float(returns[mask].mean()))
    assert PPOValueLoss(clip_range=None)(batch, {'values': mean})['metrics']['explained_variance'] == pytest.approx(0.0)


def test_value_loss_refuses_missing_fields_and_outputs():
    batch = collate(rows(), packed=False)
    values = values_for(batch)
    with pytest.raises(InvalidInputError, match="outputs\\['values'\\] is missing.*value head"):
        PPOValueLoss()(batch, {'logps': values})
    with pytest.raises(InvalidInputError, match="needs the input field 'old_values'"):
        PPOValueLoss()({k: v for k, v in batch.items() if k != 'old_values'}, {'values': values})
    batch['returns'][0, -3] = float('nan')  # a loss position of row 0 (its completion ends the padded row)
    with pytest.raises(InvalidInputError, match="'returns' is nan at row 0"):
        PPOValueLoss(clip_range=None)(batch, {'values': values})
    with pytest.raises(InvalidInputError, match='clip_range'):
        PPOValueLoss(clip_range=0)


def ref_bradley_terry(row_list, batch, values, center):
    ends = []
    for b, row in enumerate(row_list):
        n = len(row['input_ids'])
        if batch['packed']:
            ends.append(values[0, sum(len(r['input_ids']) for r in row_list[:b]) + n - 1])
        else:
            ends.append(values[b, n - 1])
    total = 0.0
    for i in range(ROWS // 2):
        c, r, m = ends[2 * i], ends[2 * i + 1], row_list[2 * i]['margin']
        total = total - torch.nn.functional.logsigmoid(c - r - m)
    loss = total / (ROWS // 2)
    chosen, rejected = torch.stack(ends[0::2]), torch.stack(ends[1::2])
    return loss + center * torch.mean((chosen + rejected) ** 2)


@pytest.mark.parametrize('packed', [False, True])
@pytest.mark.parametrize('center', [0.0, 0.01])
def test_bradley_terry_matches_the_reference(packed, center):
    row_list = rows()
    batch = collate(row_list, packed)
    values = values_for(batch)
    out = BradleyTerryLoss(center_coef=center)(batch, {'values': values})
    expected = ref_bradley_terry(row_list, batch, values, center)
    (grad,) = torch.autograd.grad(out['loss'], values)
    (expected_grad,) = torch.autograd.grad(expected, values)
    assert torch.allclose(out['loss'], expected, atol=1e-12)
    assert torch.allclose(grad, expected_grad, atol=1e-12)
    assert int((grad != 0).sum()) == ROWS  # only each row's last token carries the reward
    assert 0.0 <= out['metrics']['accuracy'] <= 1.0


def test_bradley_terry_refuses_unpaired_rows():
    batch = collate(rows()[:5], packed=False)
    with pytest.raises(InvalidInputError, match='pairs'):
        BradleyTerryLoss()(batch, {'values': values_for(batch)})


def test_kl_estimators():
    lp = torch.tensor([-1.0, -0.5, -2.0], dtype=torch.float64)
    ref = torch.tensor([-1.2, -0.1, -2.0], dtype=torch.float64)
    log_ratio = lp - ref
    assert torch.allclose(kl_estimate(lp, ref, 'k1'), log_ratio)
    assert torch.allclose(kl_estimate(lp, ref, 'k2'), 0.5 * log_ratio**2)
    assert torch.allclose(kl_estimate(lp, ref, 'k3'), torch.exp(ref - lp) - (ref - lp) - 1)
    assert kl_estimate([-1.0], [-1.0], 'k3').tolist() == [0.0]
    with pytest.raises(InvalidInputError, match='k4'):
        kl_estimate(lp, ref, 'k4')


def test_kl_estimators_are_unbiased_where_they_say_so():
    """Sampling from p, E[k1] = E[k3] = KL(p || q) exactly (k2 is biased)."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    kl = float((p * (p / q).log()).sum())
    for estimator in ('k1', 'k3'):
        expectation = float((p * kl_estimate(p.log(), q.log(), estimator)).sum())
        assert expectation == pytest.approx(kl)
    assert float((p * kl_estimate(p.log(), q.log(), 'k2')).sum()) != pytest.approx(kl)


PROMPT = [{'role': 'user', 'content': 'What is 2+2?'}]
CHOSEN = [{'role': 'assistant', 'content': '4'}]
REJECTED = [{'role': 'assistant', 'content': '5'}]


@pytest.mark.parametrize(
    'row',
    [
        {'prompt': 'What is 2+2?', 'chosen': '4', 'rejected': '5'},  # TRL standard
        {'prompt': PROMPT, 'chosen': CHOSEN, 'rejected': REJECTED},  # TRL conversational
        {'prompt': 'What is 2+2?', 'chosen': PROMPT + CHOSEN, 'rejected': PROMPT + REJECTED},  # UltraFeedback
        {'chosen': PROMPT + CHOSEN, 'rejected': PROMPT + REJECTED},  # implicit prompt
        {'chosen': '\n\nHuman: What is 2+2?\n\nAssistant: 4', 'rejected': '\n\nHuman: What is 2+2?\n\nAssistant: 5'},
        {'messages': PROMPT + CHOSEN, 'rejected_response': '5'},  # ms-swift / Twinkle
    ],
    ids=['standard', 'conversational', 'ultrafeedback', 'implicit', 'anthropic-hh', 'ms-swift'],
)
def test_chosen_rejected_processor_reads_the_usual_layouts(row):
    assert ChosenRejectedProcessor()(row) == {'messages': PROMPT, 'chosen': CHOSEN, 'rejected': REJECTED}


def test_chosen_rejected_processor_keeps_margin_and_system_and_refuses_bad_rows():
    out = ChosenRejectedProcessor(system='Be brief.', keep_fields=['id'])(
        {'prompt': 'What is 2+2?', 'chosen': '4', 'rejected': '5', 'margin': 2.0, 'id': 7, 'other': 1}
    )
    assert out['messages'][0] == {'role': 'system', 'content': 'Be brief.'} and out['margin'] == 2.0
    assert out['id'] == 7 and 'other' not in out
    with pytest.raises(InvalidInputError, match="needs 'chosen' and 'rejected'"):
        ChosenRejectedProcessor()({'prompt': 'x', 'chosen': 'y'})
    with pytest.raises(InvalidInputError, match='share no prompt'):
        ChosenRejectedProcessor()({'chosen': CHOSEN, 'rejected': REJECTED})
    with pytest.raises(InvalidInputError, match="'chosen' must be text or a non-empty list"):
        ChosenRejectedProcessor()({'prompt': 'x', 'chosen': 3, 'rejected': 'y'})
