"""The Tinker loss names this server accepts: one table for the datum check and for the model host.

Each Tinker `loss_fn` maps to the `loss_fn_inputs` every datum must carry and to the loss the model host sets,
resolved through the registry (kind `loss`) by name, with fixed constructor arguments (a request's
`loss_fn_config` is added to them). `cross_entropy` is `CrossEntropyLoss(reduction='sum')` (weights may be any
real number); the RL names are registered by twinkle-core under their Tinker names. Unknown names are refused
(never a silent cross-entropy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twinkle_server.errors import unprocessable

RL_INPUTS = ('target_tokens', 'logprobs', 'advantages')


@dataclass(frozen=True)
class TinkerLoss:
    inputs: tuple[str, ...]  # required loss_fn_inputs of every datum
    loss: str  # registered loss name (kind `loss`)
    fixed: dict[str, Any] = field(default_factory=dict)  # fixed constructor arguments


#: Tinker loss_fn -> its required inputs and the registered loss behind it.
TINKER_LOSSES: dict[str, TinkerLoss] = {
    'cross_entropy': TinkerLoss(('target_tokens',), 'CrossEntropyLoss', {'reduction': 'sum'}),
    'importance_sampling': TinkerLoss(RL_INPUTS, 'importance_sampling'),
    'ppo': TinkerLoss(RL_INPUTS, 'ppo'),
    'cispo': TinkerLoss(RL_INPUTS, 'cispo'),
    'dro': TinkerLoss(RL_INPUTS, 'dro'),
}


def tinker_loss(loss_fn: str) -> TinkerLoss:
    """The table entry for `loss_fn`; a 422 naming the supported names when there is none."""
    spec = TINKER_LOSSES.get(loss_fn)
    if spec is None:
        raise unprocessable(
            f'unknown loss_fn {loss_fn!r}; this server supports {sorted(TINKER_LOSSES)} '
            f'(custom losses run client-side via forward_backward_custom)'
        )
    return spec
