"""Named adapters on one MegatronModel, in this process (a one-rank gloo group, released at the end): names are
checked, calls must name their adapter once there are several, each adapter keeps its own configuration, and
removing the last one gives the base model back. Isolation under tp=2 + sp is tested in test_equality.py."""

from __future__ import annotations

import pytest

from twinkle_core.errors import InvalidInputError

ROWS = [{'input_ids': [5, 6, 7, 8, 9, 10], 'labels': [-100, -100, 7, 8, 9, 10]}]


@pytest.fixture()
def model(tiny_model_dir):
    from twinkle_megatron.model import MegatronModel

    m = MegatronModel(tiny_model_dir)
    yield m
    m.shutdown()


def test_adapters_are_named_addressed_and_removed(model):
    base = model.forward_only(inputs=ROWS)['logprobs']
    for bad, message in (
        ('', 'non-empty string without dots'),
        ('a.b', 'without dots'),
        ('full', 'names full-parameter training'),
    ):
        with pytest.raises(InvalidInputError, match=message):
            model.add_adapter_to_model(bad, {'r': 2})
    model.add_adapter_to_model('alice', {'r': 2})
    model.add_adapter_to_model('bob', {'r': 4, 'target_modules': ['q_proj']}, gradient_accumulation_steps=2)
    with pytest.raises(InvalidInputError, match='exists already'):
        model.add_adapter_to_model('bob', {'r': 4})
    with pytest.raises(InvalidInputError, match=r"trains adapters \['alice', 'bob'\]: name one"):
        model.forward_backward(inputs=ROWS)
    assert model.list_adapters() == ['alice', 'bob'] and not model.trains_base()
    alice, bob = (model.get_train_configs(adapter_name=n) for n in ('alice', 'bob'))
    assert (alice['adapter']['r'], bob['adapter']['r']) == (2, 4)
    assert bob['adapter']['target_modules'] == ['q_proj'] and bob['gradient_accumulation_steps'] == 2
    with pytest.raises(InvalidInputError, match="Unknown adapter 'carol'"):
        model.remove_adapter('carol')
    model.remove_adapter('alice')
    assert model.forward_only(inputs=ROWS)['logprobs'] == base  # bob's B is zero: the base model's output
    model.remove_adapter('bob')
    assert model.list_adapters() == [] and model.trains_base()
    assert model.forward_only(inputs=ROWS)['logprobs'] == base


def test_stepping_without_set_optimizer_uses_the_announced_default(model, caplog):
    model.add_adapter_to_model('alice', {'r': 2})
    with caplog.at_level('WARNING', logger='twinkle_core.train.state'):
        first = model.forward_backward(inputs=ROWS)['loss']
        model.clip_grad_and_step()
    assert any(
        "'alice' is stepped without set_optimizer(...): using AdamW(lr=0.0001)" in r.getMessage()
        for r in caplog.records
    )
    assert model.get_train_configs()['optimizer'] == {'name': 'AdamW', 'kwargs': {'lr': 1e-4}}
    assert model.forward_only(inputs=ROWS)['loss'] < first
