"""Policy-gradient losses against straightforward float64 references: values AND gradients.

The references below loop over rows and tokens and spell out each paper's / Tinker's formula directly; they share
no code with twinkle_core.loss.
"""

from __future__ import annotations

import math

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.grpo import GRPOLoss, GSPOLoss
from twinkle_core.loss.policy_gradient import CISPOLoss, DROLoss, ImportanceSamplingLoss, PPOClipLoss
from twinkle_core.registry import resolve

B, T = 4, 9
STARTS, ENDS = [2, 1, 0, 0], [9, 6, 3, 7]


def make_batch(seed: int, per_row_advantage: bool = False) -> dict:
    """Random padded batch: variable-length completions, NaN in old_logps at masked positions."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 50, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        mask[b, STARTS[b] : ENDS[b]] = True  # prompt positions before, padding after
    labels[~mask] = -100
    lp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).masked_fill(~mask, 0.0)
    old = lp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4  # ratios well outside clips
    old[~mask] = float('nan')  # masked positions may hold anything
    ref = lp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv_row = torch.randn(B, generator=g, dtype=torch.float64)
    adv_tok = torch.randn(B, T, generator=g, dtype=torch.float64)
    inputs = {'labels': labels, 'old_logps': old, 'ref_logps': ref}
    if per_row_advantage:
        inputs['advantage'] = adv_row.tolist()
    else:
        inputs['advantages'] = adv_tok
    return {
        'inputs': inputs,
        'lp': lp.requires_grad_(True),
        'mask': mask,
        'adv': adv_row[:, None].expand(B, T) if per_row_advantage else adv_tok,
    }


def loss_and_grad(loss_fn, batch):
    lp = batch['lp']
    out = loss_fn(batch['inputs'], {'logps': lp, 'mask': batch['mask']})
    (grad,) = torch.autograd.grad(out['loss'], lp)
    return out, grad


def reference_and_grad(fn, batch):
    lp = batch['lp']
    value = fn(lp, batch)
    (grad,) = torch.autograd.grad(value, lp)
    return value, grad


def tokens(batch):
    """(row, position) of every loss token, row by row."""
    return [[(b, t) for t in range(T) if batch['mask'][b, t]] for b in range(B)]


def clip(x, lo, hi):
    return torch.clamp(x, min=lo, max=hi)


# ---- Tinker losses: SUM over tokens ------------------------------------------------------------------------


def ref_is(lp, batch):
    q, a = batch['inputs']['old_logps'], batch['adv']
    return -sum(torch.exp(lp[b, t] - q[b, t]) * a[b, t] for row in tokens(batch) for b, t in row)


def ref_ppo(lo, hi):
    def fn(lp, batch):
        q, a = batch['inputs']['old_logps'], batch['adv']
        total = 0.0
        for row in tokens(batch):
            for b, t in row:
                r = torch.exp(lp[b, t] - q[b, t])
                total = total - torch.min(r * a[b, t], clip(r, lo, hi) * a[b, t])
        return total

    return fn


def ref_cispo(lo, hi):
    def fn(lp, batch):
        q, a = batch['inputs']['old_logps'], batch['adv']
        return -sum(
            clip(torch.exp(lp[b, t] - q[b, t]), lo, hi).detach() * lp[b, t] * a[b, t]
            for row in tokens(batch)
            for b, t in row
        )

    return fn


def ref_dro(beta):
    def fn(lp, batch):
        q, a = batch['inputs']['old_logps'], batch['adv']
        return -sum(
            lp[b, t] * a[b, t] - 0.5 * beta * (lp[b, t] - q[b, t]) ** 2 for row in tokens(batch) for b, t in row
        )

    return fn


@pytest.mark.parametrize('per_row', [False, True])
@pytest.mark.parametrize(
    'loss_fn, reference',
    [
        (ImportanceSamplingLoss(), ref_is),
        (PPOClipLoss(), ref_ppo(0.8, 1.2)),
        (PPOClipLoss(clip_low_threshold=0.9, clip_high_threshold=1.5), ref_ppo(0.9, 1.5)),
        (CISPOLoss(), ref_cispo(0.0, 4.0)),
        (CISPOLoss(clip_low_threshold=0.5, clip_high_threshold=1.1), ref_cispo(0.5, 1.1)),
        (DROLoss(beta=0.3), ref_dro(0.3)),
    ],
    ids=['is', 'ppo', 'ppo-custom', 'cispo', 'cispo-custom', 'dro'],
)
def test_tinker_losses_match_reference(loss_fn, reference, per_row):
    batch = make_batch(seed=1, per_row_advantage=per_row)
    out, grad = loss_and_grad(loss_fn, batch)
    want, want_grad = reference_and_grad(reference, batch)
    assert loss_fn.reduction == 'sum'
    assert out['num_tokens'] == int(batch['mask'].sum())
    torch.testing.assert_close(out['loss'], want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)
    assert torch.all(grad[~batch['mask']] == 0)


def test_ppo_clips_some_tokens_in_the_test_batch():
    """Guard for the test above: the random batch exercises both clipped and unclipped tokens."""
    out, grad = loss_and_grad(PPOClipLoss(), make_batch(seed=1))
    assert 0.1 < out['metrics']['clip_frac'] < 0.9


@pytest.mark.parametrize(
    'name, cls',
    [('importance_sampling', ImportanceSamplingLoss), ('ppo', PPOClipLoss), ('cispo', CISPOLoss), ('dro', DROLoss)],
)
def test_tinker_names_resolve_to_the_classes(name, cls):
    assert type(resolve('loss', name)) is cls


def test_tinker_config_names_are_constructor_arguments():
    loss = resolve('loss', 'ppo', clip_low_threshold=0.7, clip_high_threshold=1.3)
    assert (loss.clip_low, loss.clip_high) == (0.7, 1.3)
    assert resolve('loss', 'dro', beta=0.05).beta == 0.05


# ---- GRPO family -------------------------------------------------------------------------------------------


def ref_grpo(eps_low, eps_high, beta, loss_type, max_len=None, on_policy=False):
    """GRPO/DAPO/Dr.GRPO per-token objective with k3 KL, then the loss_type's aggregation."""

    def fn(lp, batch):
        inputs, a = batch['inputs'], batch['adv']
        rows = tokens(batch)
        per_row_sums, per_row_counts = [], []
        for row in rows:
            s = 0.0
            for b, t in row:
                old = lp[b, t].detach() if on_policy else inputs['old_logps'][b, t]
                r = torch.exp(lp[b, t] - old)
                term = -torch.min(r * a[b, t], clip(r, 1 - eps_low, 1 + eps_high) * a[b, t])
                if beta:
                    d = inputs['ref_logps'][b, t] - lp[b, t]
                    term = term + beta * (torch.exp(d) - d - 1)
                s = s + term
            per_row_sums.append(s)
            per_row_counts.append(len(row))
        if loss_type == 'grpo':
            return sum(s / n for s, n in zip(per_row_sums, per_row_counts)) / len(rows)
        if loss_type == 'bnpo':
            return sum(per_row_sums) / sum(per_row_counts)
        return sum(per_row_sums) / (len(rows) * (max_len or max(per_row_counts)))

    return fn


@pytest.mark.parametrize(
    'kwargs, reference',
    [
        ({}, ref_grpo(0.2, 0.2, 0.0, 'grpo')),
        ({'epsilon_high': 0.28}, ref_grpo(0.2, 0.28, 0.0, 'grpo')),
        ({'beta': 0.04}, ref_grpo(0.2, 0.2, 0.04, 'grpo')),
        ({'loss_type': 'bnpo', 'epsilon_high': 0.28, 'beta': 0.1}, ref_grpo(0.2, 0.28, 0.1, 'bnpo')),
        ({'loss_type': 'dr_grpo'}, ref_grpo(0.2, 0.2, 0.0, 'dr_grpo')),
        ({'loss_type': 'dr_grpo', 'max_completion_length': 16}, ref_grpo(0.2, 0.2, 0.0, 'dr_grpo', max_len=16)),
    ],
    ids=['grpo', 'dapo-clip', 'kl', 'bnpo', 'dr_grpo', 'dr_grpo-fixed-length'],
)
@pytest.mark.parametrize('per_row', [False, True])
def test_grpo_matches_reference(kwargs, reference, per_row):
    batch = make_batch(seed=2, per_row_advantage=per_row)
    out, grad = loss_and_grad(GRPOLoss(**kwargs), batch)
    want, want_grad = reference_and_grad(reference, batch)
    torch.testing.assert_close(out['loss'], want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)
    if kwargs.get('beta'):
        assert out['metrics']['kl'] > 0


def test_grpo_without_old_logps_is_on_policy():
    batch = make_batch(seed=3)
    del batch['inputs']['old_logps']
    out, grad = loss_and_grad(GRPOLoss(), batch)
    want, want_grad = reference_and_grad(ref_grpo(0.2, 0.2, 0.0, 'grpo', on_policy=True), batch)
    torch.testing.assert_close(out['loss'], want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)
    assert out['metrics']['clip_frac'] == 0.0 and math.isclose(out['metrics']['ratio_mean'], 1.0)


def ref_gspo(eps_low, eps_high):
    """Sequence-level GSPO: s_i = exp(mean_t(lp - old)); loss = -mean_i min(s_i A_i, clip(s_i) A_i)."""

    def fn(lp, batch):
        inputs, a = batch['inputs'], batch['adv']
        losses = []
        for row in tokens(batch):
            log_s = sum(lp[b, t] - inputs['old_logps'][b, t] for b, t in row) / len(row)
            s = torch.exp(log_s)
            adv = a[row[0]]
            losses.append(-torch.min(s * adv, clip(s, 1 - eps_low, 1 + eps_high) * adv))
        return sum(losses) / len(losses)

    return fn


@pytest.mark.parametrize('eps', [(3e-4, 4e-4), (0.2, 0.3)], ids=['paper-clip', 'wide-clip'])
def test_gspo_matches_sequence_level_reference(eps):
    batch = make_batch(seed=4, per_row_advantage=True)
    out, grad = loss_and_grad(GSPOLoss(epsilon=eps[0], epsilon_high=eps[1]), batch)
    want, want_grad = reference_and_grad(ref_gspo(*eps), batch)
    torch.testing.assert_close(out['loss'], want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_wide_clip_gspo_leaves_some_sequences_unclipped():
    """Guard: with (0.2, 0.3) at least one sequence of the test batch has a non-zero gradient."""
    _, grad = loss_and_grad(GSPOLoss(epsilon=0.2, epsilon_high=0.3), make_batch(seed=4, per_row_advantage=True))
    assert grad.abs().sum() > 0


# ---- packed (padding-free) layout --------------------------------------------------------------------------


def pack(batch):
    """The same rows packed into one sequence [1, sum(T)] with row_index; padding positions dropped."""
    order = [(b, t) for b in range(B) for t in range(ENDS[b])]
    idx_b = torch.tensor([b for b, _ in order])
    idx_t = torch.tensor([t for _, t in order])
    inputs = {
        k: (v[idx_b, idx_t][None] if torch.is_tensor(v) and v.dim() == 2 else v) for k, v in batch['inputs'].items()
    }
    inputs['row_index'] = idx_b[None]
    lp = batch['lp'].detach()[idx_b, idx_t][None].clone().requires_grad_(True)
    return {'inputs': inputs, 'lp': lp, 'mask': batch['mask'][idx_b, idx_t][None], 'index': (idx_b, idx_t)}


@pytest.mark.parametrize(
    'loss_fn',
    [GRPOLoss(beta=0.04), GRPOLoss(loss_type='dr_grpo'), GSPOLoss(0.2, 0.3), PPOClipLoss(), DROLoss(0.1)],
    ids=['grpo', 'dr_grpo', 'gspo', 'ppo', 'dro'],
)
@pytest.mark.parametrize('per_row', [False, True])
def test_packed_layout_gives_the_padded_result(loss_fn, per_row):
    padded = make_batch(seed=5, per_row_advantage=per_row)
    packed = pack(padded)
    out_padded, grad_padded = loss_and_grad(loss_fn, padded)
    out_packed, grad_packed = loss_and_grad(loss_fn, packed)
    torch.testing.assert_close(out_packed['loss'], out_padded['loss'], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_packed[0], grad_padded[packed['index']], rtol=1e-12, atol=1e-12)


def ref_decoupled_grpo(eps_low, eps_high, cap, with_prox):
    """Decoupled PPO with a truncated behaviour IS weight (AReaL), 'grpo' aggregation, spelt out per token."""

    def fn(lp, batch):
        inputs, a = batch['inputs'], batch['adv']
        rows = tokens(batch)
        total = 0.0
        for row in rows:
            s = 0.0
            for b, t in row:
                prox = inputs['prox_logps'][b, t] if with_prox else lp[b, t].detach()
                w = min(math.exp(float(prox - inputs['old_logps'][b, t])), cap)
                r = torch.exp(lp[b, t] - prox)
                s = s - w * torch.min(r * a[b, t], clip(r, 1 - eps_low, 1 + eps_high) * a[b, t])
            total = total + s / len(row)
        return total / len(rows)

    return fn


@pytest.mark.parametrize('with_prox', [False, True], ids=['one-update', 'proximal-logps'])
def test_truncated_is_grpo_matches_reference(with_prox):
    batch = make_batch(seed=5)
    if with_prox:
        g = torch.Generator().manual_seed(9)
        batch['inputs']['prox_logps'] = batch['lp'].detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.2
    loss_fn = GRPOLoss(epsilon=0.2, epsilon_high=0.28, tis_cap=1.5)
    out, grad = loss_and_grad(loss_fn, batch)
    want, want_grad = reference_and_grad(ref_decoupled_grpo(0.2, 0.28, 1.5, with_prox), batch)
    torch.testing.assert_close(out['loss'], want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)
    assert 0 < out['metrics']['is_truncated_frac'] < 1  # the test batch has weights on both sides of the cap
    assert out['metrics']['is_weight_mean'] <= 1.5


def test_truncated_is_needs_behaviour_logps_and_a_positive_cap():
    batch = make_batch(seed=5)
    del batch['inputs']['old_logps']
    with pytest.raises(InvalidInputError, match='old_logps'):
        loss_and_grad(GRPOLoss(tis_cap=2.0), batch)
    with pytest.raises(InvalidInputError, match='tis_cap must be > 0'):
        GRPOLoss(tis_cap=0.0)
