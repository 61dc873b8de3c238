"""Which optimizers MegatronModel builds, and the clear errors for the others (`optim.optimizer_config`, no model
needed): other torch optimizers, keywords Megatron's optimizer does not take, decayed Adam, and SGD under the
distributed optimizer (Megatron steps only Adam there; it used to fail inside Megatron with an assertion)."""

from __future__ import annotations

import pytest
import torch

from twinkle_core.errors import InvalidInputError
from twinkle_megatron.optim import optimizer_config


def config(name, distributed=False, **kwargs):
    return optimizer_config(name, kwargs, distributed=distributed, dtype=torch.float32)


def test_adam_family_and_sgd_map_to_megatron_optimizers() -> None:
    adamw = config('AdamW', lr=1e-3, betas=(0.8, 0.95))
    assert (adamw.optimizer, adamw.lr, adamw.adam_beta1, adamw.weight_decay) == ('adam', 1e-3, 0.8, 0.01)
    assert config('Adam', distributed=True).weight_decay == 0.0
    assert config('SGD', momentum=0.9).sgd_momentum == 0.9


@pytest.mark.parametrize(
    'name, distributed, kwargs, message',
    [
        ('RMSprop', False, {}, 'AdamW, Adam or SGD'),
        ('AdamW', False, {'amsgrad': True}, "does not take \\['amsgrad'\\]"),
        ('Adam', False, {'weight_decay': 0.1}, 'ask for "AdamW" instead'),
        ('SGD', True, {}, 'distributed_optimizer=False'),
    ],
)
def test_what_megatron_cannot_build_is_refused_with_the_alternative(name, distributed, kwargs, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        config(name, distributed, **kwargs)
