"""ORPO, CPO and KTO against float64 references written from TRL's definitions (values AND gradients):
``trl/trainer/orpo_trainer.py`` (``odds_ratio_loss``, NLL of the chosen rows), ``trl/trainer/cpo_trainer.py``
(``cpo_loss`` + ``cpo_alpha * nll``), ``trl/trainer/kto_trainer.py`` (``kto_loss``, loss_type ``'kto'``)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.rl.test_preference_distill_losses import PAIRS, log_sigmoid, preference_batch, row_stats
from twinkle_core.errors import InvalidInputError
from twinkle_core.loss.kto import KTOLoss
from twinkle_core.loss.odds_ratio import CPOLoss, ORPOLoss


def chosen_nll(lp, batch):
    """TRL's cross-entropy over the chosen rows' labels: -log-prob averaged over all their tokens."""
    total, count = 0.0, 0
    for i in range(PAIRS):
        pi, _, n = row_stats(lp, batch, 2 * i, False)
        total, count = total - pi, count + n
    return total / count


def ref_orpo(beta):
    def fn(lp, batch):
        ratio_term = 0.0
        for i in range(PAIRS):
            pc, _, nc = row_stats(lp, batch, 2 * i, False)
            pr, _, nr = row_stats(lp, batch, 2 * i + 1, False)
            c, r = pc / nc, pr / nr  # TRL: average_log_prob=True
            log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
            ratio_term = ratio_term + beta * log_sigmoid(log_odds)
        return chosen_nll(lp, batch) - ratio_term / PAIRS

    return fn


def ref_cpo(beta, loss_type, alpha, label_smoothing=0.0, gamma=0.5):
    def fn(lp, batch):
        total = 0.0
        for i in range(PAIRS):
            pc, _, nc = row_stats(lp, batch, 2 * i, False)
            pr, _, nr = row_stats(lp, batch, 2 * i + 1, False)
            if loss_type == 'simpo':  # TRL: average_log_prob for simpo, logits - simpo_gamma / beta
                logits = pc / nc - pr / nr - gamma / beta
            else:
                logits = pc - pr
            if loss_type == 'hinge':
                total = total + torch.relu(1 - beta * logits)
            else:
                total = (
                    total
                    - log_sigmoid(beta * logits) * (1 - label_smoothing)
                    - log_sigmoid(-beta * logits) * label_smoothing
                )
        return total / PAIRS + alpha * chosen_nll(lp, batch)

    return fn


def assert_value_and_gradient(loss_fn, reference, inputs, batch):
    out = loss_fn(inputs, {'logps': batch['lp']})
    (grad,) = torch.autograd.grad(out['loss'], batch['lp'])
    want = reference(batch['lp'], batch)
    (want_grad,) = torch.autograd.grad(want, batch['lp'])
    torch.testing.assert_close(out['loss'], want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)
    return out


@pytest.mark.parametrize('beta', [0.1, 1.0])
def test_orpo_matches_reference(beta):
    batch = preference_batch(seed=0)
    out = assert_value_and_gradient(ORPOLoss(beta=beta), ref_orpo(beta), batch['inputs'], batch)
    assert math.isclose(out['metrics']['nll'], float(chosen_nll(batch['lp'].detach(), batch)), rel_tol=1e-9)


@pytest.mark.parametrize(
    'kwargs',
    [
        {},
        {'beta': 0.5, 'alpha': 0.0, 'label_smoothing': 0.1},
        {'loss_type': 'hinge', 'beta': 0.3, 'alpha': 0.5},
        {'loss_type': 'simpo', 'beta': 2.0, 'simpo_gamma': 1.0},
    ],
    ids=['sigmoid', 'no-nll-smoothed', 'hinge', 'simpo'],
)
def test_cpo_matches_reference(kwargs):
    batch = preference_batch(seed=1)
    reference = ref_cpo(
        kwargs.get('beta', 0.1),
        kwargs.get('loss_type', 'sigmoid'),
        kwargs.get('alpha', 1.0),
        kwargs.get('label_smoothing', 0.0),
        kwargs.get('simpo_gamma', 0.5),
    )
    assert_value_and_gradient(CPOLoss(**kwargs), reference, batch['inputs'], batch)


def ref_kto(beta, labels, desirable_weight=1.0, undesirable_weight=1.0, reference_point='kl'):
    def fn(lp, batch):
        ratios = []
        for r in range(len(labels)):
            pi, ref, _ = row_stats(lp, batch, r, True)
            ratios.append(pi - ref)
        kl_rows = [x for x, label in zip(ratios, labels) if label == -1] or ratios
        # TRL: kl = (policy_KL_logps - reference_KL_logps).mean().clamp(min=0), detached
        kl = torch.clamp(sum(x.detach() for x in kl_rows) / len(kl_rows), min=0) if reference_point == 'kl' else 0
        losses = []
        for x, label in zip(ratios, labels):
            if label == 1:
                losses.append(desirable_weight * (1 - torch.sigmoid(beta * (x - kl))))
            elif label == 0:
                losses.append(undesirable_weight * (1 - torch.sigmoid(beta * (kl - x))))
        return sum(losses) / len(losses)

    return fn


@pytest.mark.parametrize(
    'labels, kwargs',
    [
        ([1, 0, 1, 0, 1, 0], {}),
        ([1, 1, 0, -1, 1, -1], {'beta': 0.5, 'desirable_weight': 1.33}),
        ([1, 0, 0, 0, -1, 1], {'beta': 2.0, 'undesirable_weight': 0.7}),
        ([1, 0, 0, 1, 0, 1], {'reference_point': 'zero'}),
    ],
    ids=['kl-from-rows', 'kl-rows', 'kl-rows-weighted', 'zero-reference'],
)
def test_kto_matches_reference(labels, kwargs):
    batch = preference_batch(seed=2)
    inputs = {**batch['inputs'], 'kto_label': labels}
    reference = ref_kto(kwargs.get('beta', 0.1), labels, **{k: v for k, v in kwargs.items() if k != 'beta'})
    out = assert_value_and_gradient(KTOLoss(**kwargs), reference, inputs, batch)
    assert out['metrics']['desirable'] == labels.count(1) and out['metrics']['kl'] >= 0


def test_kto_reference_point_moves_with_the_kl_rows_only():
    """Raising the KL rows' log-ratio raises z0 (and so the desirable rows' loss); the labelled rows do not set it."""
    batch = preference_batch(seed=3)
    labels = [1, 0, -1, 1, 0, -1]
    inputs = {**batch['inputs'], 'kto_label': labels}
    low = KTOLoss(beta=1.0)(inputs, {'logps': batch['lp']})['metrics']['kl']
    shifted = batch['lp'].detach().clone()
    shifted[2] += 0.5 * batch['mask'][2]  # a KL row
    high = KTOLoss(beta=1.0)(inputs, {'logps': shifted})['metrics']['kl']
    assert high > low
    shifted = batch['lp'].detach().clone()
    shifted[0] += 0.5 * batch['mask'][0]  # a labelled row
    assert KTOLoss(beta=1.0)(inputs, {'logps': shifted})['metrics']['kl'] == pytest.approx(low)


def test_bad_inputs_are_refused_with_what_was_wrong():
    batch = preference_batch(seed=4)
    lp = {'logps': batch['lp']}
    with pytest.raises(InvalidInputError, match='ORPOLoss needs \\(chosen, rejected\\) row pairs.*5 rows'):
        ORPOLoss()({'labels': batch['inputs']['labels'][:5]}, {'logps': batch['lp'][:5]})
    with pytest.raises(InvalidInputError, match="CPOLoss: unknown loss_type 'ipo'"):
        CPOLoss(loss_type='ipo')
    with pytest.raises(InvalidInputError, match="KTOLoss needs the input field 'kto_label'"):
        KTOLoss()(batch['inputs'], lp)
    with pytest.raises(InvalidInputError, match='kto_label of row 1 is 2.0'):
        KTOLoss()({**batch['inputs'], 'kto_label': [1, 2, 0, 0, 1, 1]}, lp)
    with pytest.raises(InvalidInputError, match='only KL rows'):
        KTOLoss()({**batch['inputs'], 'kto_label': [-1] * 6}, lp)
    with pytest.raises(InvalidInputError, match="KTOLoss needs the input field 'ref_logps'"):
        KTOLoss()({'labels': batch['inputs']['labels'], 'kto_label': [1] * 6}, lp)
    with pytest.raises(InvalidInputError, match='beta must be > 0'):
        ORPOLoss(beta=0)
