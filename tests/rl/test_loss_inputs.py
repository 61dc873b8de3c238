"""Bad inputs to RL losses fail loudly with messages that name the field, the loss and the place."""

from __future__ import annotations

import pytest
import torch

from twinkle_core.errors import ComponentNotFoundError, InvalidInputError
from twinkle_core.loss.grpo import GRPOLoss
from twinkle_core.loss.policy_gradient import PPOClipLoss
from twinkle_core.registry import resolve


def batch(**overrides):
    labels = torch.tensor([[-100, 5, 6, -100], [-100, -100, 7, 8]])
    inputs = {'labels': labels, 'old_logps': torch.full((2, 4), -1.0), 'advantages': torch.ones(2, 4)}
    inputs.update(overrides)
    return inputs, {'logps': torch.full((2, 4), -0.9, requires_grad=True)}


def test_unknown_loss_name_raises_with_close_matches():
    with pytest.raises(ComponentNotFoundError, match='GRPOLoss'):
        resolve('loss', 'GRPOLos')
    with pytest.raises(ComponentNotFoundError):
        resolve('loss', 'ppo2')


def test_wrong_length_advantages():
    inputs, outputs = batch(advantages=torch.ones(2, 3))
    with pytest.raises(
        InvalidInputError,
        match=r"PPOClipLoss: per-token field 'advantages' has shape \(2, 3\) but "
        r'labels have shape \(2, 4\)',
    ):
        PPOClipLoss()(inputs, outputs)
    inputs, outputs = batch(advantages=None, advantage=[1.0, 2.0, 3.0])
    with pytest.raises(InvalidInputError, match="per-row field 'advantage' has 3 values but the batch has 2 rows"):
        GRPOLoss()(inputs, outputs)


def test_missing_fields_name_the_field_and_the_loss():
    inputs, outputs = batch(advantages=None)
    with pytest.raises(InvalidInputError, match="GRPOLoss needs the input field 'advantages'.*'advantage'"):
        GRPOLoss()(inputs, outputs)
    inputs, outputs = batch(old_logps=None)
    with pytest.raises(InvalidInputError, match="PPOClipLoss needs the input field 'old_logps'"):
        PPOClipLoss()(inputs, outputs)
    inputs, outputs = batch()
    with pytest.raises(InvalidInputError, match="GRPOLoss needs the input field 'ref_logps'"):
        GRPOLoss(beta=0.1)(inputs, outputs)
    with pytest.raises(InvalidInputError, match="outputs\\['logps'\\] is missing"):
        GRPOLoss()(inputs, {})


def test_nan_policy_masked_positions_ignored_loss_positions_rejected():
    old = torch.full((2, 4), -1.0)
    old[0, 0] = float('nan')  # masked: ignored
    inputs, outputs = batch(old_logps=old)
    out = PPOClipLoss()(inputs, outputs)
    out['loss'].backward()
    assert torch.isfinite(out['loss']) and torch.isfinite(outputs['logps'].grad).all()
    old[1, 3] = float('inf')  # a loss position
    inputs, outputs = batch(old_logps=old)
    with pytest.raises(InvalidInputError, match="'old_logps' is inf at row 1, position 3, which is a loss position"):
        PPOClipLoss()(inputs, outputs)
    inputs, outputs = batch(advantages=None, advantage=[1.0, float('nan')])
    with pytest.raises(InvalidInputError, match="'advantage' of row 1 is nan"):
        GRPOLoss()(inputs, outputs)


def test_bad_configuration():
    with pytest.raises(InvalidInputError, match="unknown loss_type 'dapo'"):
        GRPOLoss(loss_type='dapo')
    with pytest.raises(InvalidInputError, match='clip_low_threshold \\(1.5\\) must be <= clip_high_threshold'):
        resolve('loss', 'ppo', clip_low_threshold=1.5, clip_high_threshold=1.2)


def test_batch_without_loss_tokens_gives_zero_loss_attached_to_the_graph():
    inputs, outputs = batch(labels=torch.full((2, 4), -100))
    for loss_fn in (GRPOLoss(), GRPOLoss(loss_type='bnpo'), GRPOLoss(loss_type='dr_grpo'), PPOClipLoss()):
        out = loss_fn(inputs, outputs)
        assert float(out['loss'].detach()) == 0.0 and out['num_tokens'] == 0 and out['loss'].requires_grad
