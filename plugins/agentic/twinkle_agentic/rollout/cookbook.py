"""`CookbookRollout`: tinker-cookbook environments (`Env` / `EnvGroupBuilder`) played by a local sampler, no server.

    from tinker_cookbook.recipes.multiplayer_rl.guess_number.env import GuessNumberEnvGroupBuilder
    rollout = CookbookRollout(TorchSampler(model_dir), sampling_params={'max_tokens': 64}, max_turns=10)
    episodes = rollout([GuessNumberEnvGroupBuilder(answer=42, renderer=renderer, num_envs=8)])
    model.forward_backward(inputs=episodes, old_logps=[e['logprobs'] for e in episodes], advantages=...)

A cookbook env is token-level: ``initial_observation()`` gives a ``tinker.ModelInput`` and a stop condition,
``step(action_tokens)`` the reward, whether the episode is done and the next observation (usually the whole
conversation re-rendered). As in `MultiTurnRollout`, each turn is ONE ``sampler.sample`` call over the live episodes
(one per distinct stop condition); the env methods of all episodes run concurrently (they are coroutines). When
the next observation extends the episode so far (observation + sampled action), only the new tokens are appended,
with label -100: the sampled tokens stay exactly as sampled, with their log-probs. An observation that does not
extend it starts a new row, as the cookbook's own ``trajectory_to_data`` does.

Each returned episode: ``rows`` (the trainable rows: ``input_ids``, ``labels``, ``logprobs``; usually one), the
same three fields at top level when there is one row, ``reward`` (the step rewards plus the group reward of
``EnvGroupBuilder.compute_group_rewards``), ``group`` (the builder's index; -1 for a bare env), ``turns``,
``stop_reason`` (the env's ``stop/<reason>`` metric, else ``stop``; ``max_turns`` / ``context_overflow`` when this
rollout cut it), ``truncated``, ``metrics``, ``logs`` and ``trajectory`` (the cookbook ``Trajectory``, for its
own data utilities). Needs ``tinker-cookbook`` (imported on first use).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.types import IGNORE_INDEX, SamplingParams

_STOP_METRIC_PREFIX = 'stop/'  # the cookbook's one-hot stop-reason metrics (tinker_cookbook.rl.types)
#: Stop reasons of an episode that ended by the policy's or the env's choice (the others are `truncated`).
_FINISHED = frozenset({'stop', 'completed', 'tool_stopped'})


@dataclass
class _Row:
    input_ids: list[int]
    labels: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.labels = [IGNORE_INDEX] * len(self.input_ids)

    def as_dict(self) -> dict[str, Any]:
        return {'input_ids': list(self.input_ids), 'labels': list(self.labels), 'logprobs': list(self.logprobs)}


@dataclass
class _CookbookEpisode:
    env: Any
    group: int
    rows: list[_Row] = field(default_factory=list)
    stop: Any = None  # the stop condition of the next turn
    transitions: list[Any] = field(default_factory=list)
    observation: Any = None  # the last observation (a tinker.ModelInput)
    stop_reason: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    logs: dict[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.stop_reason is None

    def observe(self, observation: Any) -> None:
        """Extend the current row by the observation's new tokens (label -100), or start a new row."""
        self.observation = observation
        ids = _token_ids(observation)
        row = self.rows[-1] if self.rows else None
        if row is not None and ids[: len(row.input_ids)] == row.input_ids:
            new = ids[len(row.input_ids) :]
            row.input_ids += new
            row.labels += [IGNORE_INDEX] * len(new)
        else:
            self.rows.append(_Row(list(ids)))


def _token_ids(observation: Any) -> list[int]:
    try:
        return list(observation.to_ints())
    except Exception as exc:  # image chunks: the local samplers here take token ids only
        raise InvalidInputError(f'CookbookRollout needs token-only observations: {exc}') from exc


class CookbookRollout:
    """Run tinker-cookbook envs with `sampler` (TorchSampler, vLLMSampler, a Ray group: anything with
    ``sample(prompts, sampling_params, adapter_name=...)``).

    Args:
        sampling_params: per turn (``max_tokens`` caps each turn; the env's stop condition replaces ``stop``;
            ``num_samples`` must be 1: a group builder makes one env per wanted episode).
        max_turns: the most sampled turns per episode (None: the env decides, as the cookbook's loop does).
        max_trajectory_tokens: the most tokens a row may hold (``context_overflow`` when the next turn cannot fit).
        adapter_name: the sampler's LoRA adapter to sample with.
    """

    def __init__(
        self,
        sampler: Any,
        *,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        max_turns: int | None = None,
        max_trajectory_tokens: int | None = None,
        adapter_name: str | None = None,
    ) -> None:
        params = SamplingParams.model_validate(dict(sampling_params or {}))
        if params.num_samples != 1:
            raise InvalidInputError(
                f'CookbookRollout samples one action per episode and turn (num_samples={params.num_samples}).'
            )
        if max_turns is not None and max_turns < 1:
            raise InvalidInputError(f'max_turns must be >= 1, got {max_turns}.')
        self.sampler, self.params, self.adapter_name = sampler, params, adapter_name
        self.max_turns, self.max_tokens = max_turns, max_trajectory_tokens

    def __call__(self, envs_or_builders: Sequence[Any]) -> list[dict[str, Any]]:
        """Play every env (or every env of every `EnvGroupBuilder`, group by group); returns the episodes in order.
        Not for code already inside an event loop: await `arun` there."""
        return asyncio.run(self.arun(envs_or_builders))

    async def arun(self, envs_or_builders: Sequence[Any]) -> list[dict[str, Any]]:
        """The coroutine behind `__call__`."""
        from tinker_cookbook.rl.types import EnvGroupBuilder

        groups: list[tuple[Any, list[Any]]] = []  # (builder or None, envs)
        for item in envs_or_builders:
            if isinstance(item, EnvGroupBuilder):
                groups.append((item, list(await item.make_envs())))
            else:
                groups.append((None, [item]))
        episodes = [
            _CookbookEpisode(env, index if builder is not None else -1)
            for index, (builder, envs) in enumerate(groups)
            for env in envs
        ]
        await asyncio.gather(*(self._start(e) for e in episodes))
        turns = 0
        while any(e.live for e in episodes):
            if self.max_turns is not None and turns >= self.max_turns:
                for e in episodes:
                    if e.live:
                        e.stop_reason = 'max_turns'
                break
            acting = self._sample_turn([e for e in episodes if e.live])
            await asyncio.gather(*(self._step(e, action) for e, action in acting))
            turns += 1
        return await self._finish(groups, episodes)

    async def _start(self, e: _CookbookEpisode) -> None:
        from tinker_cookbook.rl.types import InitialObservationOverflow

        first = await e.env.initial_observation()
        if isinstance(first, InitialObservationOverflow):
            e.metrics, e.logs = dict(first.metrics), dict(first.logs)
            e.stop_reason = _stop_from_metrics(first.metrics) or 'context_overflow'
            e.rows.append(_Row([]))
            return
        observation, e.stop = first
        e.observe(observation)

    def _sample_turn(self, live: list[_CookbookEpisode]) -> list[tuple[_CookbookEpisode, Any]]:
        """One batched sample per (stop condition, token budget); returns each episode's action."""
        from tinker_cookbook.completers import TokensWithLogprobs

        batches: dict[tuple[Any, int], list[_CookbookEpisode]] = {}
        for e in live:
            used = len(e.rows[-1].input_ids)
            room = self.params.max_tokens if self.max_tokens is None else self.max_tokens - used
            if room < 1:
                e.stop_reason = 'context_overflow'
                continue
            key = (tuple(e.stop or ()), min(self.params.max_tokens, room))
            batches.setdefault(key, []).append(e)
        acting = []
        for (stop, max_tokens), group in batches.items():
            params = self.params.model_copy(
                update={'max_tokens': max_tokens, 'stop': list(stop) or None, 'logprobs': True}
            )
            prompts = [{'input_ids': list(e.rows[-1].input_ids)} for e in group]
            responses = self.sampler.sample(prompts, params, adapter_name=self.adapter_name)
            for e, response in zip(group, responses):
                seq = response.sequences[0]
                tokens = list(seq.tokens)
                logprobs = [lp if isinstance(lp, float) else lp[0][1] for lp in seq.logprobs or []]
                row = e.rows[-1]
                row.input_ids += tokens
                row.labels += tokens
                row.logprobs += [float(lp) for lp in logprobs]
                reason: Literal['length', 'stop'] = 'length' if seq.stop_reason == 'length' else 'stop'
                acting.append((e, TokensWithLogprobs(tokens, logprobs, reason)))
        return acting

    async def _step(self, e: _CookbookEpisode, action: Any) -> None:
        from tinker_cookbook.rl.types import Transition

        result = await e.env.step(action.tokens, extra={'stop_reason': action.stop_reason})
        e.transitions.append(
            Transition(
                e.observation, action, result.reward, result.episode_done, dict(result.metrics), dict(result.logs)
            )
        )
        if result.episode_done:
            e.observation = result.next_observation
            e.stop_reason = _stop_from_metrics(result.metrics) or 'stop'
            return
        e.stop = result.next_stop_condition
        if self.max_tokens is not None and len(_token_ids(result.next_observation)) >= self.max_tokens:
            e.observation, e.stop_reason = result.next_observation, 'context_overflow'  # no room for a turn
            return
        e.observe(result.next_observation)

    async def _finish(
        self, groups: list[tuple[Any, list[Any]]], episodes: list[_CookbookEpisode]
    ) -> list[dict[str, Any]]:
        from tinker_cookbook.rl.types import Trajectory

        trajectories = [
            Trajectory(transitions=e.transitions, final_ob=e.observation, stop_reason=e.stop_reason) for e in episodes
        ]
        final: list[tuple[float, dict[str, Any]]] = []
        start = 0
        for builder, envs in groups:
            part = trajectories[start : start + len(envs)]
            if builder is None:
                final += [(0.0, {})] * len(envs)
            else:
                final += [(float(r), dict(m)) for r, m in await builder.compute_group_rewards(part, envs)]
            start += len(envs)
        out = []
        for e, trajectory, (group_reward, group_metrics) in zip(episodes, trajectories, final):
            rows = [r.as_dict() for r in e.rows if r.input_ids]
            metrics = {**e.metrics, **{k: v for t in e.transitions for k, v in t.metrics.items()}, **group_metrics}
            result: dict[str, Any] = {
                'rows': rows,
                'reward': sum(t.reward for t in e.transitions) + group_reward,
                'group': e.group,
                'turns': len(e.transitions),
                'stop_reason': e.stop_reason,
                'truncated': e.stop_reason not in _FINISHED,
                'metrics': metrics,
                'logs': [t.logs for t in e.transitions] or [e.logs],
                'trajectory': trajectory,
            }
            if len(rows) == 1:
                result.update(rows[0])
            out.append(result)
        return out


def _stop_from_metrics(metrics: Mapping[str, Any]) -> str | None:
    """The stop reason of a cookbook one-hot ``stop/<reason>`` metric, if any."""
    for key, value in metrics.items():
        if key.startswith(_STOP_METRIC_PREFIX) and value:
            return key[len(_STOP_METRIC_PREFIX) :]
    return None
