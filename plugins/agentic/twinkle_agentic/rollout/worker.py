"""`EpisodeWorker`: multi-turn episodes as an `AsyncRLDriver` rollout worker (twinkle_core.rl).

    worker = EpisodeWorker(MultiTurnRollout(sampler, template, env='GuessNumberEnv'), new_prompts, group_size=8)
    driver = AsyncRLDriver(model, lambda: worker, train_step, groups_per_step=12, partial_rollouts='continue')

Per call, the trajectories `new_prompts()` returns -- groups of `group_size` consecutive copies of one prompt
(GRPO: one group per prompt) -- are played together by the rollout; each group becomes one `RolloutGroup` whose
rows are the episodes (trainable as they are) with the sampler's log-probs as a per-token ``old_logps`` field,
their rewards, and the policy version of every sampled token (an episode in flight picks up newer weights between
turns through the driver's ``context.refresh``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from twinkle_core.rl import RolloutContext, RolloutGroup
from twinkle_core.train.row_keywords import with_row_keywords

if TYPE_CHECKING:
    from twinkle_agentic.rollout.multi_turn import MultiTurnRollout


class EpisodeWorker:
    """Plays `new_prompts()` with `rollout` on each call; `group_size` must divide their number."""

    def __init__(self, rollout: MultiTurnRollout, new_prompts: Callable[[], list[dict[str, Any]]], group_size: int):
        self.rollout = rollout
        self.sampler = rollout.sampler  # the driver keeps its weights up to date
        self.new_prompts = new_prompts
        self.group_size = group_size

    @property
    def adapter_name(self) -> str | None:
        """The sampler adapter the rollout samples with (checked by `AsyncRLDriver` against the policy's)."""
        return self.rollout.adapter_name

    def __call__(self, context: RolloutContext) -> list[RolloutGroup]:
        prompts = self.new_prompts()
        size = self.group_size
        if not prompts or len(prompts) % size:
            raise ValueError(f'EpisodeWorker: {len(prompts)} prompts is not a whole number of groups of {size}')
        played = self.rollout(prompts, before_turn=context.refresh)
        if any('reward' not in e for e in played):
            raise ValueError('EpisodeWorker: an episode has no reward; give the rollout an env that scores episodes')
        # the behaviour log-probs (one per sampled token) at their label positions: a per-token old_logps field
        episodes = with_row_keywords(played, old_logps=[e['logprobs'] for e in played])
        return [
            RolloutGroup(
                episodes[i : i + size],
                [e['reward'] for e in episodes[i : i + size]],
                token_versions=[e['token_versions'] for e in episodes[i : i + size]],
            )
            for i in range(0, len(episodes), size)
        ]
