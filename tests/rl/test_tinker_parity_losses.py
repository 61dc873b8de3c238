"""Tinker's `gspo` and `stable_reinforce` losses against float64 references spelled out token by token (values AND
gradients); they share no code with twinkle_core.loss. Batches come from `test_policy_losses.make_batch` (padded
rows, NaN at masked positions, ratios well outside the clips)."""

from __future__ import annotations

import math

import pytest
import torch
from test_policy_losses import B, T, loss_and_grad, make_batch, reference_and_grad, tokens

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.policy_gradient import GSPOTokenLoss, StableReinforceLoss
from twinkle_core.registry import resolve


def ref_gspo(lo, hi, ratio_mask=None):
    """-sum_t min(s_t A_t, clip(s_t, lo, hi) A_t); s_t = exp(log s + lp_t - sg(lp_t)), log s = mean over M."""

    def fn(lp, batch):
        q, a = batch['inputs']['old_logps'], batch['adv']
        total = 0.0
        for row in tokens(batch):
            in_m = [(b, t) for b, t in row if (ratio_mask[b][t] if ratio_mask is not None else a[b, t] != 0)]
            log_s = sum(float(lp[b, t] - q[b, t]) for b, t in in_m) / len(in_m) if in_m else 0.0
            for b, t in row:
                s_t = torch.exp(log_s + lp[b, t] - lp[b, t].detach())
                clipped = torch.clamp(s_t, min=lo[b][t] if isinstance(lo, list) else lo, max=hi)
                total = total - torch.min(s_t * a[b, t], clipped * a[b, t])
        return total

    return fn


def ref_stable_reinforce(lo, hi, kl, action=None):
    """sum_t m_t (-sg(clip(r, lo, hi)) lp A + kl (r - 1 - log r)), m = action mask (default A != 0)."""

    def fn(lp, batch):
        q, a = batch['inputs']['old_logps'], batch['adv']
        total = 0.0
        for row in tokens(batch):
            for b, t in row:
                if not (action[b][t] if action is not None else a[b, t] != 0):
                    continue
                log_r = lp[b, t] - q[b, t]
                r = torch.exp(log_r)
                total = total - torch.clamp(r.detach(), lo, hi) * lp[b, t] * a[b, t] + kl * (r - 1 - log_r)
        return total

    return fn


@pytest.mark.parametrize('per_row', [False, True])
@pytest.mark.parametrize('lo_hi', [(1 - 3e-4, 1 + 4e-4), (0.8, 1.3)])
def test_gspo_matches_reference(per_row, lo_hi):
    batch = make_batch(seed=11, per_row_advantage=per_row)
    out, grad = loss_and_grad(GSPOTokenLoss(*lo_hi), batch)
    want, want_grad = reference_and_grad(ref_gspo(*lo_hi), batch)
    assert float(out['loss']) == pytest.approx(float(want), rel=1e-10)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_gspo_sequence_ratio_mask_and_per_token_thresholds():
    batch = make_batch(seed=12)
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(B, T, generator=g) > 0.4).to(torch.float64)
    mask[3] = 0.0  # a row with nothing in M: s = 1
    low = (0.7 + 0.2 * torch.rand(B, T, generator=g, dtype=torch.float64)).tolist()
    batch['inputs'] = {**batch['inputs'], 'sequence_ratio_mask': mask, 'clip_low_threshold': torch.tensor(low)}
    out, grad = loss_and_grad(GSPOTokenLoss(0.5, 1.2), batch)
    want, want_grad = reference_and_grad(ref_gspo(low, 1.2, ratio_mask=(mask != 0).tolist()), batch)
    assert float(out['loss']) == pytest.approx(float(want), rel=1e-10)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_gspo_token_ratio_value_is_the_sequence_ratio():
    """Every token of a row carries exp(mean log-ratio over M) (here with a wide clip, so nothing is clipped)."""
    batch = make_batch(seed=13, per_row_advantage=True)
    out = GSPOTokenLoss(0.0, 1e9)(batch['inputs'], {'logps': batch['lp'], 'mask': batch['mask']})
    q = batch['inputs']['old_logps']
    s = [math.exp(sum(float(batch['lp'][b, t] - q[b, t]) for b, t in row) / len(row)) for row in tokens(batch)]
    want = -sum(s[i] * float(batch['adv'][b, t]) for i, row in enumerate(tokens(batch)) for b, t in row)
    assert float(out['loss']) == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize('per_row', [False, True])
@pytest.mark.parametrize('config', [{}, {'kl_coeff': 0.3, 'clip_low_threshold': 0.5, 'clip_high_threshold': 1.5}])
def test_stable_reinforce_matches_reference(per_row, config):
    batch = make_batch(seed=14, per_row_advantage=per_row)
    out, grad = loss_and_grad(StableReinforceLoss(**config), batch)
    kl, lo, hi = (
        config.get('kl_coeff', 0.0),
        config.get('clip_low_threshold', 0.0),
        config.get('clip_high_threshold', 2.0),
    )
    want, want_grad = reference_and_grad(ref_stable_reinforce(lo, hi, kl), batch)
    assert float(out['loss']) == pytest.approx(float(want), rel=1e-10)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_stable_reinforce_action_mask_limits_the_objective():
    """Positions outside the action mask add nothing (even with huge ratios there) and get no gradient."""
    batch = make_batch(seed=15)
    g = torch.Generator().manual_seed(5)
    action = torch.rand(B, T, generator=g) > 0.5
    old = batch['inputs']['old_logps'].clone()
    old[~action & batch['mask']] = -500.0  # exp(lp - q) would overflow if those positions were evaluated
    batch['inputs'] = {**batch['inputs'], 'old_logps': old, 'action_mask': action.to(torch.float64)}
    out, grad = loss_and_grad(StableReinforceLoss(kl_coeff=0.2), batch)
    want, want_grad = reference_and_grad(ref_stable_reinforce(0.0, 2.0, 0.2, action=action.tolist()), batch)
    assert math.isfinite(float(out['loss']))
    assert float(out['loss']) == pytest.approx(float(want), rel=1e-10)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)
    assert bool((grad[~action] == 0).all())


@pytest.mark.parametrize(
    'cls, kwargs',
    [
        (GSPOTokenLoss, {'clip_low_threshold': 1.2, 'clip_high_threshold': 1.1}),
        (GSPOTokenLoss, {'clip_low_threshold': float('nan')}),
        (StableReinforceLoss, {'kl_coeff': -0.1}),
        (StableReinforceLoss, {'kl_coeff': 'big'}),
        (StableReinforceLoss, {'clip_low_threshold': -1.0}),
    ],
)
def test_bad_config_raises_invalid_input(cls, kwargs):
    with pytest.raises(InvalidInputError):
        cls(**kwargs)


def test_tinker_names_resolve_to_the_new_losses():
    assert isinstance(resolve('loss', 'gspo'), GSPOTokenLoss)
    assert isinstance(resolve('loss', 'stable_reinforce', kl_coeff=0.01), StableReinforceLoss)
    assert resolve('loss', 'GSPOTokenLoss').reduction == 'sum'
