"""Multi-turn rollouts: `MultiTurnRollout` (a local or Ray sampler, token-exact, trainable) and
`APIMultiTurnRollout` (an OpenAI-compatible endpoint, for evaluation and data collection) and `CookbookRollout`
(tinker-cookbook environments played by a local sampler)."""

from twinkle_agentic.rollout.api import APIMultiTurnRollout
from twinkle_agentic.rollout.cookbook import CookbookRollout
from twinkle_agentic.rollout.multi_turn import MultiTurnRollout

__all__ = ['APIMultiTurnRollout', 'CookbookRollout', 'MultiTurnRollout']
