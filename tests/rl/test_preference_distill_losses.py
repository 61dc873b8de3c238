"""DPO-family and GKD losses against straightforward float64 references: values AND gradients."""

from __future__ import annotations

import math

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.dpo import DPOLoss
from twinkle_core.loss.gkd import GKDLoss

PAIRS, T, V = 3, 8, 11


def preference_batch(seed: int) -> dict:
    """3 (chosen, rejected) pairs -> 6 rows; each row has its own prompt length and completion length."""
    g = torch.Generator().manual_seed(seed)
    rows = 2 * PAIRS
    spans = [(2, 8), (2, 5), (1, 7), (1, 3), (3, 8), (3, 6)]
    mask = torch.zeros(rows, T, dtype=torch.bool)
    for r, (start, end) in enumerate(spans):
        mask[r, start:end] = True
    labels = torch.randint(0, 50, (rows, T), generator=g).masked_fill(~mask, -100)
    lp = (-torch.rand(rows, T, generator=g, dtype=torch.float64) * 2).masked_fill(~mask, 0.0)
    ref = -torch.rand(rows, T, generator=g, dtype=torch.float64) * 2
    ref[~mask] = float('nan')
    return {'inputs': {'labels': labels, 'ref_logps': ref}, 'lp': lp.requires_grad_(True), 'mask': mask}


def row_stats(lp, batch, r, use_ref):
    """(sum of policy logps, sum of reference logps, number of tokens) of row r, by plain iteration."""
    positions = [t for t in range(T) if batch['mask'][r, t]]
    pi = sum(lp[r, t] for t in positions)
    ref = sum(batch['inputs']['ref_logps'][r, t] for t in positions) if use_ref else 0.0
    return pi, ref, len(positions)


def log_sigmoid(x):
    return -torch.log1p(torch.exp(-x))


def ref_dpo(beta, loss_type, label_smoothing=0.0, reference_free=False, gamma=0.5):
    def fn(lp, batch):
        total = 0.0
        for i in range(PAIRS):
            pc, rc, nc = row_stats(lp, batch, 2 * i, not reference_free and loss_type != 'simpo')
            pr, rr, nr = row_stats(lp, batch, 2 * i + 1, not reference_free and loss_type != 'simpo')
            if loss_type == 'sigmoid':
                z = beta * ((pc - rc) - (pr - rr))
            elif loss_type == 'simpo':
                z = beta * (pc / nc - pr / nr) - gamma
            else:  # ipo: squared distance of the length-normalised log-ratio margin from 1/(2 beta)
                total = total + ((pc - rc) / nc - (pr - rr) / nr - 1 / (2 * beta)) ** 2
                continue
            total = total - (1 - label_smoothing) * log_sigmoid(z) - label_smoothing * log_sigmoid(-z)
        return total / PAIRS

    return fn


@pytest.mark.parametrize(
    'kwargs',
    [
        {},
        {'beta': 0.5, 'label_smoothing': 0.1},
        {'reference_free': True},
        {'loss_type': 'ipo', 'beta': 0.2},
        {'loss_type': 'simpo', 'beta': 2.0, 'simpo_gamma': 1.0},
        {'loss_type': 'simpo', 'label_smoothing': 0.2},
    ],
    ids=['sigmoid', 'smoothed', 'reference-free', 'ipo', 'simpo', 'simpo-smoothed'],
)
def test_dpo_matches_reference(kwargs):
    batch = preference_batch(seed=0)
    loss_fn = DPOLoss(**kwargs)
    out = loss_fn(batch['inputs'], {'logps': batch['lp']})
    (grad,) = torch.autograd.grad(out['loss'], batch['lp'])
    reference = ref_dpo(
        kwargs.get('beta', 0.1),
        kwargs.get('loss_type', 'sigmoid'),
        kwargs.get('label_smoothing', 0.0),
        kwargs.get('reference_free', False),
        kwargs.get('simpo_gamma', 0.5),
    )
    want = reference(batch['lp'], batch)
    (want_grad,) = torch.autograd.grad(want, batch['lp'])
    torch.testing.assert_close(out['loss'], want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_dpo_metrics_are_the_implicit_rewards():
    batch = preference_batch(seed=1)
    beta = 0.3
    out = DPOLoss(beta=beta)(batch['inputs'], {'logps': batch['lp']})
    rewards = []
    for r in range(2 * PAIRS):
        pi, ref, _ = row_stats(batch['lp'].detach(), batch, r, True)
        rewards.append(float(beta * (pi - ref)))
    chosen, rejected = rewards[0::2], rewards[1::2]
    m = out['metrics']
    assert math.isclose(m['rewards/chosen'], sum(chosen) / PAIRS, rel_tol=1e-9)
    assert math.isclose(m['rewards/rejected'], sum(rejected) / PAIRS, rel_tol=1e-9)
    assert math.isclose(m['margin'], (sum(chosen) - sum(rejected)) / PAIRS, rel_tol=1e-9, abs_tol=1e-12)
    assert m['accuracy'] == sum(c > r for c, r in zip(chosen, rejected)) / PAIRS


def test_dpo_rejects_unpaired_rows_and_empty_completions():
    batch = preference_batch(seed=2)
    odd = {'labels': batch['inputs']['labels'][:5], 'ref_logps': batch['inputs']['ref_logps'][:5]}
    with pytest.raises(InvalidInputError, match='pairs.*5 rows'):
        DPOLoss()(odd, {'logps': batch['lp'][:5]})
    labels = batch['inputs']['labels'].clone()
    labels[3] = -100
    with pytest.raises(InvalidInputError, match='row 3 \\(rejected\\) has no loss tokens'):
        DPOLoss()({**batch['inputs'], 'labels': labels}, {'logps': batch['lp']})
    with pytest.raises(InvalidInputError, match="DPOLoss needs the input field 'ref_logps'"):
        DPOLoss()({'labels': batch['inputs']['labels']}, {'logps': batch['lp']})


# ---- GKD ---------------------------------------------------------------------------------------------------


def distill_batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    rows = 3
    mask = torch.zeros(rows, T, dtype=torch.bool)
    mask[0, 2:8], mask[1, 1:4], mask[2, 3:6] = True, True, True
    labels = torch.randint(0, V, (rows, T), generator=g).masked_fill(~mask, -100)
    student = (torch.randn(rows, T, V, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    teacher = torch.randn(rows, T, V, generator=g, dtype=torch.float64) * 2
    teacher[~mask] = float('nan')  # only loss positions are read
    return {'labels': labels, 'mask': mask, 'student': student, 'teacher': teacher}


def ref_gkd(student_logits, batch, beta, temperature):
    """Generalised JSD_beta(teacher P, student Q) = beta*KL(P||M) + (1-beta)*KL(Q||M), M = beta*P + (1-beta)*Q,
    summed over the vocabulary by hand, averaged over loss positions. beta 0 / 1: KL(P||Q) / KL(Q||P)."""
    total, count = 0.0, 0
    for b in range(student_logits.shape[0]):
        for t in range(T):
            if not batch['mask'][b, t]:
                continue
            q = torch.softmax(student_logits[b, t] / temperature, -1)
            p = torch.softmax(batch['teacher'][b, t] / temperature, -1)
            if beta == 0.0:  # endpoints by convention (TRL's): the plain forward / reverse KL
                value = sum(p[v] * torch.log(p[v] / q[v]) for v in range(V))
            elif beta == 1.0:
                value = sum(q[v] * torch.log(q[v] / p[v]) for v in range(V))
            else:
                m = beta * p + (1 - beta) * q
                kl_pm = sum(p[v] * torch.log(p[v] / m[v]) for v in range(V))
                kl_qm = sum(q[v] * torch.log(q[v] / m[v]) for v in range(V))
                value = beta * kl_pm + (1 - beta) * kl_qm
            total, count = total + value, count + 1
    return total / count


@pytest.mark.parametrize(
    'beta, temperature',
    [(0.5, 1.0), (0.1, 2.0), (0.0, 1.0), (1.0, 0.7)],
    ids=['jsd', 'jsd-0.1-T2', 'forward-kl', 'reverse-kl'],
)
def test_gkd_matches_reference(beta, temperature):
    batch = distill_batch(seed=3)
    loss_fn = GKDLoss(beta=beta, temperature=temperature)
    assert loss_fn.needs_logits
    out = loss_fn(
        {'labels': batch['labels'], 'teacher_logits': batch['teacher']},
        {'logps': torch.zeros(batch['labels'].shape, dtype=torch.float64), 'logits': batch['student']},
    )
    (grad,) = torch.autograd.grad(out['loss'], batch['student'])
    want = ref_gkd(batch['student'], batch, beta, temperature)
    (want_grad,) = torch.autograd.grad(want, batch['student'])
    torch.testing.assert_close(out['loss'], want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    'beta, temperature, chunk',
    [(0.5, 1.0, 1), (0.1, 2.0, 4), (0.0, 1.0, 5), (1.0, 0.7, 100)],
    ids=['jsd-chunk1', 'jsd-0.1-T2-chunk4', 'forward-kl-chunk5', 'reverse-kl-one-chunk'],
)
def test_gkd_from_hidden_states_in_chunks_equals_gkd_from_full_logits(beta, temperature, chunk):
    # the memory-bounded layout: final hidden states [B, T, H] + output embedding [V, H] instead of logits
    batch = distill_batch(seed=5)
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(3, T, 6, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, 6, generator=g, dtype=torch.float64, requires_grad=True)
    inputs = {'labels': batch['labels'], 'teacher_logits': batch['teacher']}
    logps = torch.zeros(batch['labels'].shape, dtype=torch.float64)
    full = GKDLoss(beta=beta, temperature=temperature)(inputs, {'logps': logps, 'logits': hidden @ weight.T})
    chunked = GKDLoss(beta=beta, temperature=temperature, chunk_tokens=chunk)(
        inputs, {'logps': logps, 'hidden_states': hidden, 'output_weight': weight}
    )
    torch.testing.assert_close(chunked['loss'], full['loss'], rtol=1e-10, atol=1e-12)
    assert chunked['num_tokens'] == full['num_tokens'] == int(batch['mask'].sum())
    want = torch.autograd.grad(full['loss'], (hidden, weight))
    got = torch.autograd.grad(chunked['loss'], (hidden, weight))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_gkd_refuses_outputs_without_logits_or_hidden_states_and_a_bad_chunk_size():
    batch = distill_batch(seed=4)
    with pytest.raises(InvalidInputError, match="outputs\\['logits'\\] \\(or 'hidden_states' \\+ 'output_weight'\\)"):
        GKDLoss()({'labels': batch['labels'], 'teacher_logits': batch['teacher']}, {'logps': torch.zeros(3, T)})
    with pytest.raises(InvalidInputError, match='chunk_tokens must be >= 1'):
        GKDLoss(chunk_tokens=0)


def test_gkd_is_zero_when_student_equals_teacher_and_checks_shapes():
    batch = distill_batch(seed=4)
    teacher = torch.nan_to_num(batch['teacher'])
    out = GKDLoss()(
        {'labels': batch['labels'], 'teacher_logits': teacher},
        {'logps': torch.zeros(batch['labels'].shape), 'logits': teacher.clone()},
    )
    assert abs(float(out['loss'])) < 1e-12
    with pytest.raises(InvalidInputError, match='teacher_logits have shape'):
        GKDLoss()(
            {'labels': batch['labels'], 'teacher_logits': teacher[..., :5]},
            {'logps': torch.zeros(batch['labels'].shape), 'logits': teacher},
        )
    with pytest.raises(InvalidInputError, match="GKDLoss needs the input field 'teacher_logits'"):
        GKDLoss()({'labels': batch['labels']}, {'logps': torch.zeros(batch['labels'].shape), 'logits': teacher})
