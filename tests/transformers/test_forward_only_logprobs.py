"""`forward_only(compute_loss=False)`: logprobs without running the configured loss (RL loops need behaviour and
reference logprobs while an RL loss that requires advantages is set)."""

from __future__ import annotations

import pytest

from tests.transformers.row_helpers import labelled_rows
from twinkle_core.errors import InvalidInputError

pytestmark = pytest.mark.usefixtures('one_thread')


def test_transformers_model_logprobs_only_while_rl_loss_is_set(tiny_model_dir):
    from twinkle_transformers.model import TransformersModel

    model = TransformersModel(model_id=str(tiny_model_dir))
    model.add_adapter_to_model('default', {'r': 4, 'lora_alpha': 8, 'target_modules': ['q_proj', 'v_proj']})
    rows = labelled_rows(seed=0)
    reference = model.forward_only(inputs=rows)['logprobs']  # cross-entropy is set: loss computed too
    model.set_loss('GRPOLoss')
    with pytest.raises(InvalidInputError, match='advantages'):
        model.forward_only(inputs=rows)  # the RL loss needs advantages these rows do not carry
    out = model.forward_only(inputs=rows, compute_loss=False)
    assert 'loss' not in out
    assert out['logprobs'] == reference


def test_multi_lora_logprobs_only_while_rl_loss_is_set(tiny_model_dir):
    from twinkle_transformers.multi_lora import MultiLoraTransformersModel

    model = MultiLoraTransformersModel(model_id=str(tiny_model_dir))
    model.add_adapter_to_model('a', {'r': 4, 'lora_alpha': 8, 'target_modules': ['q_proj', 'v_proj']})
    rows = labelled_rows(seed=1)
    reference = model.forward_only(inputs=rows, adapter_name='a')['logprobs']
    model.set_loss('GRPOLoss', adapter_name='a')
    failed = model.forward_only(inputs={'a': rows}, return_errors=True)
    assert failed['a']['error']['stage'] == 'loss' and 'advantages' in failed['a']['error']['message']
    out = model.forward_only(inputs=rows, adapter_name='a', compute_loss=False)
    assert 'loss' not in out
    assert out['logprobs'] == reference
