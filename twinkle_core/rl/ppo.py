"""PPO with a critic: turn scored rollouts into the policy's and the critic's training rows, and `PPOStep`, the
step an `AsyncRLDriver` (or any loop) calls to train both.

    values = critic_values(critic, rows)            # the critic's value before each trained token of each row
    advantages = GAEAdvantage(gamma=1.0, lam=0.95)(rewards, values=values, kl=kl, kl_coef=0.05)
    critic_rows = with_gae(rows, advantages, values)   # rows get per-token 'advantages'
    policy.forward_backward(inputs=rows)            # e.g. GRPOLoss(loss_type='bnpo'): PPO's clipped surrogate
    critic.forward_backward(inputs=critic_rows)     # PPOValueLoss on 'returns' / 'old_values'

``rows`` are training rows (``input_ids``, ``labels`` -100 where nothing is trained, the sampler's ``old_logps``),
one per episode. The **trained tokens** (``labels != -100``: a completion, or a multi-turn episode's model turns)
are the steps GAE runs over, in order (tokens between them -- a tool's reply -- are part of the next state, not
steps). The critic is any model whose `forward_only` returns per-row ``values`` aligned with ``input_ids`` (element
``i``: the value of the state before token ``i``): ``TransformersValueModel``, local or on a Ray group.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.rl.rollout_group import RolloutGroup
from twinkle_core.types import IGNORE_INDEX


def trained_positions(row: dict[str, Any]) -> list[int]:
    """The indices of `row`'s trained tokens (``labels != -100``)."""
    return [i for i, label in enumerate(row['labels']) if label != IGNORE_INDEX]


def critic_values(critic: Any, rows: Sequence[dict[str, Any]], *, batch_size: int = 64) -> list[list[float]]:
    """The critic's value of the state before each trained token of each row (no gradients)."""
    values: list[list[float]] = []
    for start in range(0, len(rows), batch_size):
        out = critic.forward_only(
            inputs=[{'input_ids': r['input_ids']} for r in rows[start : start + batch_size]], compute_loss=False
        )
        if 'values' not in out:
            raise InvalidInputError(
                f'critic_values: {type(critic).__name__}.forward_only returned no values; the critic is a value '
                'model (TransformersValueModel).'
            )
        values.extend(out['values'])
    return [[v[i] for i in trained_positions(row)] for v, row in zip(values, rows)]


def with_gae(
    rows: Sequence[dict[str, Any]], advantages: Sequence[Sequence[float]], values: Sequence[Sequence[float]]
) -> list[dict[str, Any]]:
    """Put each episode's per-token `advantages` on its row (field ``advantages``, 0 where nothing is trained) and
    return the critic's rows: the same tokens and labels with ``returns`` (``advantages.returns``: GAE's, before
    any whitening) and ``old_values`` (the critic's `values` when the rollout was scored, for the value clip)."""
    returns = getattr(advantages, 'returns', None)
    if returns is None:
        raise InvalidInputError('with_gae: the advantages carry no returns; compute them with GAEAdvantage.')
    critic_rows = []
    for row, adv, ret, old in zip(rows, advantages, returns, values):
        positions = trained_positions(row)
        if not len(adv) == len(ret) == len(old) == len(positions):
            raise InvalidInputError(
                f'with_gae: a row has {len(positions)} trained tokens but {len(adv)} advantages, {len(ret)} returns '
                f'and {len(old)} values.'
            )
        row['advantages'] = _scatter(len(row['input_ids']), positions, adv)
        critic_rows.append(
            {
                'input_ids': row['input_ids'],
                'labels': row['labels'],
                'returns': _scatter(len(row['input_ids']), positions, ret),
                'old_values': _scatter(len(row['input_ids']), positions, old),
            }
        )
    return critic_rows


def _scatter(length: int, positions: list[int], values: Sequence[float]) -> list[float]:
    out = [0.0] * length
    for i, value in zip(positions, values):
        out[i] = float(value)
    return out


class PPOStep:
    """``step(groups, step_index) -> metrics``: one PPO step on `groups` (an `AsyncRLDriver` `TrainStep`).

    The critic values the rollouts, `advantage_fn` (a `GAEAdvantage`) turns the rewards and values into per-token
    advantages and returns, then `updates_per_batch` times: one step of the policy (its loss: set it first, e.g.
    ``GRPOLoss(loss_type='bnpo')``) and one of the critic (``PPOValueLoss``), each clipped to `max_norm`. Metrics:
    ``reward``, the policy loss's metrics and the critic's as ``critic/<name>`` (of the first update: the rollout's
    own values).
    """

    def __init__(
        self,
        policy: Any,
        critic: Any,
        advantage_fn: Any,
        *,
        updates_per_batch: int = 1,
        max_norm: float | None = 1.0,
    ) -> None:
        if updates_per_batch < 1:
            raise InvalidInputError(f'PPOStep: updates_per_batch must be >= 1, got {updates_per_batch}.')
        self.policy, self.critic, self.advantage_fn = policy, critic, advantage_fn
        self.updates_per_batch, self.max_norm = updates_per_batch, max_norm

    def __call__(self, groups: list[RolloutGroup], step: int) -> dict[str, Any]:
        rows = [dict(row) for group in groups for row in group.rows]
        rewards = [r for group in groups for r in group.rewards]
        values = critic_values(self.critic, rows)
        critic_rows = with_gae(rows, self.advantage_fn(rewards, values=values), values)
        metrics: dict[str, Any] = {'reward': fmean(rewards)}
        for update in range(self.updates_per_batch):
            policy_out = self.policy.forward_backward(inputs=rows)
            self.policy.clip_grad_and_step(max_norm=self.max_norm)
            critic_out = self.critic.forward_backward(inputs=critic_rows)
            self.critic.clip_grad_and_step(max_norm=self.max_norm)
            if update == 0:
                metrics.update(policy_out.get('metrics', {}))
                metrics.update({f'critic/{k}': v for k, v in critic_out.get('metrics', {}).items()})
        return metrics
