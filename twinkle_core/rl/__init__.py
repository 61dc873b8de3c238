"""Reinforcement-learning drivers: `AsyncRLDriver` overlaps rollouts and training with bounded staleness
(docs/async_rl.md); `PolicyWeights` publishes numbered policy versions to a concurrently running sampler."""

from twinkle_core.rl.async_driver import AsyncRLDriver, RolloutWorker, RunReport, StepRecord
from twinkle_core.rl.policy_weights import LatestWeightsEngine, PolicyWeights
from twinkle_core.rl.rollout_buffer import RolloutBuffer
from twinkle_core.rl.rollout_group import RolloutContext, RolloutGroup, rows_with_advantages

__all__ = [
    'AsyncRLDriver',
    'LatestWeightsEngine',
    'PolicyWeights',
    'RolloutBuffer',
    'RolloutContext',
    'RolloutGroup',
    'RolloutWorker',
    'RunReport',
    'StepRecord',
    'rows_with_advantages',
]
