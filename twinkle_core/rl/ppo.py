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
from twinkle_core.runtime.distributed import all_reduce_sum
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


def rollout_explained_variance(values: Sequence[Sequence[float]], returns: Sequence[Sequence[float]]) -> float:
    """1 - Var(returns - values) / Var(returns) over every trained token of the batch -- and of every rank's batch
    under torchrun (the sums are all-reduced): how much of the return the critic's rollout `values` explain (1:
    all, 0: no more than the mean return; nan when every return is equal). `PPOValueLoss` reports the same metric
    per micro-batch and data-parallel shard, averaged; on small shards that mean is dominated by shards whose
    returns barely vary, this is the batch's own figure."""
    flat = [(r, r - v) for vs, rs in zip(values, returns) for v, r in zip(vs, rs)]
    sums = [float(len(flat))]
    sums += [sum(x[k] ** p for x in flat) for k in (0, 1) for p in (1, 2)]
    n, r1, r2, d1, d2 = all_reduce_sum(sums)
    if n == 0:
        return float('nan')
    var_r, var_d = r2 / n - (r1 / n) ** 2, d2 / n - (d1 / n) ** 2
    return float('nan') if var_r <= 1e-12 else 1.0 - var_d / var_r


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
    own values; ``critic/explained_variance`` over the whole batch, `rollout_explained_variance`).
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
        advantages = self.advantage_fn(rewards, values=values)
        critic_rows = with_gae(rows, advantages, values)
        metrics: dict[str, Any] = {'reward': fmean(rewards)}
        for update in range(self.updates_per_batch):
            policy_out = self.policy.forward_backward(inputs=rows)
            self.policy.clip_grad_and_step(max_norm=self.max_norm)
            critic_out = self.critic.forward_backward(inputs=critic_rows)
            self.critic.clip_grad_and_step(max_norm=self.max_norm)
            if update == 0:
                metrics.update(policy_out.get('metrics', {}))
                metrics.update({f'critic/{k}': v for k, v in critic_out.get('metrics', {}).items()})
        metrics['critic/explained_variance'] = rollout_explained_variance(values, advantages.returns)  # batch-wide
        return metrics
