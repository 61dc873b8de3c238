"""Asynchronous multi-turn RL: `AsyncRLDriver` trains on `MultiTurnRollout` episodes; with partial rollouts
``'continue'`` an episode in flight picks up newer weights between its turns and records each token's version,
with ``'finish'`` it ends under the version it started with."""

from __future__ import annotations

import time
from typing import Any

import pytest

from twinkle_agentic.rollout import MultiTurnRollout
from twinkle_core.advantage import GRPOAdvantage
from twinkle_core.model import TransformersModel
from twinkle_core.registry import resolve_class
from twinkle_core.rl import AsyncRLDriver, RolloutContext, RolloutGroup
from twinkle_core.types import IGNORE_INDEX

EPISODES = 4
GAME = {'low': 1, 'high': 8, 'max_guesses': 3, 'tool': False}


class GuessWorker:
    """One group of `EPISODES` guess-number games per call. On call 1 its second turn waits until version 1 is
    published (so that a weight update falls inside the episode, deterministically)."""

    def __init__(self, model: TransformersModel, template: Any, driver: dict[str, AsyncRLDriver]) -> None:
        self.sampler = resolve_class('sampler', 'TorchSampler')(model_id=model.model_dir)
        self.rollout = MultiTurnRollout(
            self.sampler,
            template,
            env='GuessNumberEnv',
            env_kwargs=GAME,
            sampling_params={'max_tokens': 4, 'temperature': 1.0, 'seed': 3},
            max_turns=3,
        )
        self.driver = driver

    def __call__(self, context: RolloutContext) -> list[RolloutGroup]:
        turn = 0

        def before_turn() -> int:
            nonlocal turn
            turn += 1
            if context.call_index == 1 and turn == 2:
                weights, deadline = self.driver['driver'].weights, time.monotonic() + 60
                while weights.latest_version <= context.version and time.monotonic() < deadline:
                    time.sleep(0.05)
            return context.refresh()

        games = [{'messages': [{'role': 'user', 'content': 'Guess my number.'}], 'user_data': {'secret': 5}}] * EPISODES
        episodes = self.rollout(games, before_turn=before_turn)
        return [
            RolloutGroup(
                episodes, [e['reward'] for e in episodes], token_versions=[e['token_versions'] for e in episodes]
            )
        ]


@pytest.mark.parametrize('partial', ['continue', 'finish'])
def test_episodes_in_flight_record_the_version_of_every_token(tiny_model_dir, template, partial):
    model = TransformersModel(model_id=tiny_model_dir)
    model.set_optimizer('AdamW', lr=1e-3)
    model.set_loss('GRPOLoss')
    advantage_fn = GRPOAdvantage(scale='group')
    trained: list[RolloutGroup] = []

    def train_step(groups: list[RolloutGroup], step: int) -> dict[str, Any]:
        trained.extend(groups)
        episodes = [e for g in groups for e in g.rows]
        model.forward_backward(
            inputs=episodes,
            old_logps=[e['logprobs'] for e in episodes],
            advantages=[a for g in groups for a in advantage_fn(g.rewards, group_size=len(g.rewards))],
        )
        model.clip_grad_and_step()
        return {}

    holder: dict[str, AsyncRLDriver] = {}
    driver = AsyncRLDriver(
        model,
        lambda: GuessWorker(model, template, holder),
        train_step,
        groups_per_step=1,
        max_staleness=1,
        partial_rollouts=partial,
    )
    holder['driver'] = driver
    report = driver.run(2)

    second = trained[1]  # sampled by call 1, whose second turn began after version 1 was published
    assert second.policy_version == 0 and report.steps[1].staleness == [1]
    spanning = [e for e in second.rows if e['turns'] >= 2]
    assert spanning, 'no episode reached a second turn'
    for e in second.rows:
        versions = e['token_versions']
        assert len(versions) == sum(label != IGNORE_INDEX for label in e['labels']) == len(e['logprobs'])
        assert versions == sorted(versions)  # versions never go back within an episode
    for e in spanning:
        first_turn = e['turn_log'][0]['tokens']
        expected_later = 1 if partial == 'continue' else 0
        assert set(e['token_versions'][:first_turn]) == {0}
        assert set(e['token_versions'][first_turn:]) == {expected_later}
    assert all(set(e['token_versions']) == {0} for e in trained[0].rows)
