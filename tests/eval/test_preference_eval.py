"""Held-out preference evaluation (`twinkle_core.eval.preference`): generated pairs with disjoint splits, rows as
`DPOLoss` takes them, and the loss's own metrics over held-out pairs before and after DPO steps on a real model."""

from __future__ import annotations

import json

import pytest

from twinkle_core.eval.arithmetic import split_of
from twinkle_core.eval.preference import (
    answer_logprob,
    arithmetic_preference_pairs,
    encode_pairs,
    evaluate_preferences,
    with_reference,
)
from twinkle_core.registry import resolve


def problem(pair: dict) -> tuple[int, int]:
    words = pair['messages'][0]['content'].split()
    return int(words[2]), int(words[4].rstrip('?'))


def test_pairs_are_right_against_wrong_sums_and_the_splits_never_share_a_problem():
    train = arithmetic_preference_pairs(300, split='train')
    test = arithmetic_preference_pairs(100, split='test')
    assert not {problem(p) for p in train} & {problem(p) for p in test}
    assert all(split_of(*problem(p), '+', 0.2) == 'test' for p in test)
    for pair in train + test:
        a, b = problem(pair)
        assert int(pair['chosen']) == a + b and 1 <= abs(int(pair['rejected']) - (a + b)) <= 10
    assert arithmetic_preference_pairs(5, split='test') == arithmetic_preference_pairs(5, split='test')  # seeded


@pytest.fixture(scope='module')
def policy(tiny_model_dir):
    from twinkle_core.model import TransformersModel

    model = TransformersModel(model_id=tiny_model_dir)
    model.add_adapter_to_model('default', {'r': 8, 'lora_alpha': 16, 'target_modules': 'all-linear'})
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)
    rows = with_reference(model, encode_pairs(template, arithmetic_preference_pairs(16, split='test')))
    model.set_loss('DPOLoss', beta=0.1)
    return model, template, rows


def test_rows_are_interleaved_with_labels_on_the_answer_only(policy):
    _, template, rows = policy
    pairs = arithmetic_preference_pairs(16, split='test')
    assert len(rows) == 32
    for i, pair in enumerate(pairs):
        for row, answer in ((rows[2 * i], pair['chosen']), (rows[2 * i + 1], pair['rejected'])):
            labelled = [t for t, label in zip(row['input_ids'], row['labels']) if label != -100]
            assert template.decode(labelled).strip().startswith(answer)
            assert len(row['ref_logps']) == len(row['input_ids'])


def test_before_training_the_rewards_are_zero_and_the_policy_preference_is_its_own(policy):
    model, _, rows = policy
    metrics = evaluate_preferences(model, rows, batch_size=8).metrics
    assert metrics['pairs'] == 16 and metrics['accuracy'] == 0.0
    assert metrics['margin'] == pytest.approx(0.0, abs=1e-6)
    logps = model.forward_only(inputs=rows, compute_loss=False)['logprobs']
    answer = [answer_logprob(r, lp) for r, lp in zip(rows, logps)]
    by_hand = sum(c > r for c, r in zip(answer[0::2], answer[1::2])) / 16
    assert metrics['policy_accuracy'] == pytest.approx(by_hand)
    assert metrics['policy_accuracy_low'] <= by_hand <= metrics['policy_accuracy_high']


def test_after_dpo_steps_the_pairs_margin_is_positive_and_logged(policy, tmp_path, monkeypatch):
    from twinkle_core import hooks

    model, _, rows = policy
    model.set_optimizer('AdamW', lr=5e-3)
    for _ in range(6):
        model.forward_backward(inputs=rows)
        model.clip_grad_and_step(max_norm=1.0)
    path = tmp_path / 'metrics.jsonl'
    monkeypatch.setenv('TWINKLE_METRICS_JSONL', str(path))
    hooks.reset_plugin_manager()
    try:
        metrics = evaluate_preferences(model, rows, step=6, batch_size=16).metrics
    finally:
        hooks.reset_plugin_manager()
    assert metrics['margin'] > 0 and metrics['accuracy'] > 0.5
    assert metrics['rewards/chosen'] - metrics['rewards/rejected'] == pytest.approx(metrics['margin'], abs=1e-5)
    trained = model.forward_only(inputs=rows)['metrics']  # the DPO loss's own metrics mean the same
    for key in ('margin', 'accuracy', 'rewards/chosen', 'rewards/rejected'):
        assert metrics[key] == pytest.approx(trained[key], rel=1e-4, abs=1e-6), key
    (line,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert line['step'] == 6 and line['metrics']['eval/preference/margin'] == pytest.approx(metrics['margin'])


def test_rows_must_come_in_pairs(policy):
    model, _, rows = policy
    with pytest.raises(ValueError, match='pairs and batch_size must be even'):
        evaluate_preferences(model, rows[:3])
    with pytest.raises(ValueError, match='pairs and batch_size must be even'):
        evaluate_preferences(model, rows, batch_size=5)


@pytest.mark.parametrize('loss', ['ORPOLoss', 'CPOLoss', 'KTOLoss'])
def test_the_other_preference_losses_move_the_same_held_out_metrics(tiny_model_dir, loss):
    """ORPO, CPO and KTO (each answer an unpaired desirable / undesirable row) trained on the pairs raise the DPO
    implicit-reward margin and accuracy that `evaluate_preferences` measures, whatever the loss."""
    from twinkle_core.model import TransformersModel

    model = TransformersModel(model_id=tiny_model_dir)
    model.add_adapter_to_model('default', {'r': 8, 'lora_alpha': 16, 'target_modules': 'all-linear'})
    template = resolve('template', 'Template', model_id_or_tokenizer=model.tokenizer)
    rows = with_reference(model, encode_pairs(template, arithmetic_preference_pairs(16, split='test')))
    train = [{**row, 'kto_label': 1 - i % 2} for i, row in enumerate(rows)] if loss == 'KTOLoss' else rows
    model.set_loss(loss, beta=0.1)
    model.set_optimizer('AdamW', lr=5e-3)
    for _ in range(6):
        model.forward_backward(inputs=train)
        model.clip_grad_and_step(max_norm=1.0)
    metrics = evaluate_preferences(model, rows, batch_size=16).metrics
    assert metrics['margin'] > 0 and metrics['accuracy'] > 0.5, metrics
