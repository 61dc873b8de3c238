"""Reinforcement-learning drivers: `AsyncRLDriver` overlaps rollouts and training with bounded staleness
(docs/async_rl.md), `PolicyGradientStep` is its training step (with the off-policy statistics);
`PolicyWeights` publishes numbered policy versions to a concurrently running sampler; `PPOStep` trains a policy and
its critic (PPO with GAE) in place of `PolicyGradientStep`."""

from twinkle_core.rl.async_driver import AsyncRLDriver, RolloutWorker, RunReport, StepRecord
from twinkle_core.rl.policy_weights import LatestWeightsEngine, PolicyWeights
from twinkle_core.rl.ppo import PPOStep
from twinkle_core.rl.progress import run_with_progress
from twinkle_core.rl.rollout_buffer import RolloutBuffer
from twinkle_core.rl.rollout_group import RolloutContext, RolloutGroup, rows_with_advantages
from twinkle_core.rl.train_step import (
    PolicyGradientStep,
    importance_ratio_stats,
    off_policy_line,
    summarize_off_policy,
)

__all__ = [
    'AsyncRLDriver',
    'LatestWeightsEngine',
    'PolicyGradientStep',
    'PPOStep',
    'PolicyWeights',
    'RolloutBuffer',
    'RolloutContext',
    'RolloutGroup',
    'RolloutWorker',
    'RunReport',
    'StepRecord',
    'importance_ratio_stats',
    'off_policy_line',
    'rows_with_advantages',
    'run_with_progress',
    'summarize_off_policy',
]
