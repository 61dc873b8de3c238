"""The Tinker loss names this server accepts, translated at the edge: the model host only sees twinkle loss names.

Each Tinker `loss_fn` maps to the `loss_fn_inputs` every datum must carry and to a registered loss (kind `loss`) with
fixed constructor arguments (a request's `loss_fn_config` is added to them): `twinkle_loss` gives the name and the
arguments a `TrainBatch` carries. `cross_entropy` is `CrossEntropyLoss(reduction='sum')` (weights may be any
real number); the RL names are registered by twinkle-core under their Tinker names. Unknown names are refused
(never a silent cross-entropy), and so is a `loss_fn_config` with a key the loss does not take or a value it
refuses (`check_config`: a 422 before anything is queued, naming the keys it takes).

`gspo` additionally reads the optional per-token inputs `sequence_ratio_mask`, `clip_low_threshold` and
`clip_high_threshold`; `stable_reinforce` may carry provenance spans instead of usable `logprobs`
(`tinker.stability`). `cross_entropy` with 2-D ``(N, K)`` `target_tokens` and `weights` (soft / top-k targets)
is the same loss with `candidates=True`, set by the server from the data (`internal`: never a client's key).
`custom` runs a loss uploaded with `/create_custom_loss` (`engine.custom_loss.program`): its `loss_fn_config` is exactly
`{loss_id}`, and the batch carries the graph instead of a name (the model host builds its `GraphLoss`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from twinkle_core.errors import TwinkleError
from twinkle_core.registry import resolve_class
from twinkle_server.errors import unprocessable

RL_INPUTS = ('target_tokens', 'logprobs', 'advantages')


@dataclass(frozen=True)
class TinkerLoss:
    inputs: tuple[str, ...]  # required loss_fn_inputs of every datum
    loss: str  # registered loss name (kind `loss`)
    fixed: dict[str, Any] = field(default_factory=dict)  # fixed constructor arguments
    internal: tuple[str, ...] = ()  # constructor arguments the server sets from the data, refused in loss_fn_config


#: Tinker loss_fn -> its required inputs and the registered loss behind it.
TINKER_LOSSES: dict[str, TinkerLoss] = {
    'cross_entropy': TinkerLoss(('target_tokens',), 'CrossEntropyLoss', {'reduction': 'sum'}, ('candidates',)),
    'importance_sampling': TinkerLoss(RL_INPUTS, 'importance_sampling'),
    'ppo': TinkerLoss(RL_INPUTS, 'ppo'),
    'cispo': TinkerLoss(RL_INPUTS, 'cispo'),
    'dro': TinkerLoss(RL_INPUTS, 'dro'),
    'gspo': TinkerLoss(RL_INPUTS, 'gspo'),
    # logprobs: from the datum, or from the sampler's records where its provenance spans say (tinker.stability)
    'stable_reinforce': TinkerLoss(RL_INPUTS, 'stable_reinforce'),
    # a loss uploaded with /create_custom_loss, named by loss_fn_config {loss_id} (engine.custom_loss.program)
    'custom': TinkerLoss(('target_tokens',), ''),
}


def tinker_loss(loss_fn: str) -> TinkerLoss:
    """The table entry for `loss_fn`; a 422 naming the supported names when there is none."""
    spec = TINKER_LOSSES.get(loss_fn)
    if spec is None:
        raise unprocessable(
            f'unknown loss_fn {loss_fn!r}; this server supports {sorted(TINKER_LOSSES)} '
            f"('custom' runs a loss created with ServiceClient.create_custom_loss)"
        )
    return spec


def twinkle_loss(loss_fn: str, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The registered loss name and constructor arguments (fixed ones, then `config`) behind Tinker's `loss_fn`."""
    spec = tinker_loss(loss_fn)
    return spec.loss, {**spec.fixed, **config}


def check_config(loss_fn: str, config: dict[str, Any]) -> None:
    """A 422 unless `config` (a request's `loss_fn_config`) only names constructor arguments of `loss_fn`'s loss
    (its fixed ones excluded) with values that loss accepts."""
    spec = tinker_loss(loss_fn)
    if loss_fn == 'custom':
        if set(config) != {'loss_id'} or not isinstance(config['loss_id'], str):
            raise unprocessable(
                f"loss_fn 'custom' takes loss_fn_config {{'loss_id': <the id create_custom_loss returned>}}, got "
                f'{config}'
            )
        return
    if not config:
        return
    cls = resolve_class('loss', spec.loss)
    params = inspect.signature(cls).parameters.values()
    skip = {*spec.fixed, *spec.internal}
    takes = sorted(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in skip)
    unknown = sorted(set(config) - set(takes))
    if unknown:
        raise unprocessable(
            f'loss_fn_config keys {unknown} are not valid for loss_fn {loss_fn!r}; it takes {takes or "no keys"}'
        )
    try:
        cls(**spec.fixed, **config)
    except (TwinkleError, TypeError, ValueError) as exc:
        raise unprocessable(f'loss_fn_config {config} is not valid for loss_fn {loss_fn!r}: {exc}') from None
