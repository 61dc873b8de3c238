"""Multi-turn rollouts: `MultiTurnRollout` (a local or Ray sampler, token-exact, trainable) and
`APIMultiTurnRollout` (an OpenAI-compatible endpoint, for evaluation and data collection) and `CookbookRollout`
(tinker-cookbook environments played by a local sampler); `EpisodeWorker` plays episodes for
`twinkle_core.rl.AsyncRLDriver`; `TinkerSampler` samples a rollout through a tinker SDK `SamplingClient` (the
service), and `episode_datum` / `sft_datum` make its episodes `tinker.Datum`s; `OpenAISampler` samples an
OpenAI-compatible endpoint for `twinkle_core.eval.evaluate`."""

from twinkle_agentic.rollout.api import APIMultiTurnRollout
from twinkle_agentic.rollout.cookbook import CookbookRollout
from twinkle_agentic.rollout.multi_turn import MultiTurnRollout
from twinkle_agentic.rollout.openai_sampler import OpenAISampler
from twinkle_agentic.rollout.tinker_sampler import TinkerSampler, episode_datum, sft_datum
from twinkle_agentic.rollout.worker import EpisodeWorker

__all__ = [
    'APIMultiTurnRollout',
    'CookbookRollout',
    'EpisodeWorker',
    'MultiTurnRollout',
    'OpenAISampler',
    'TinkerSampler',
    'episode_datum',
    'sft_datum',
]
