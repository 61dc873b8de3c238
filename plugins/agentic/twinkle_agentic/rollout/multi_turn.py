"""`MultiTurnRollout`: episodes of several turns with tool calls, sampled in batches, token-exact.

    rollout = MultiTurnRollout(sampler, template, tool_manager=ToolManager(['calculator']), max_turns=4)
    episodes = rollout(trajectories)             # same number, same order
    model.forward_backward(inputs=episodes, old_logps=[e['logprobs'] for e in episodes], advantages=...)

Each turn issues ONE `sampler.sample` call over all live episodes (grouped only by how many new tokens each may
still take); finished episodes leave the batch. A sampled turn is parsed for tool calls (Qwen3/Hermes
``<tool_call>{json}</tool_call>``); calls on the env's tools go to `Env.step`, the others to the `ToolManager`
(sandboxed, concurrently across episodes); their answers come back as ``tool`` turns, and an answer without a tool
call goes to `Env.respond` (or ends the episode when there is no env). Malformed or unknown calls, bad arguments,
tool exceptions and timeouts become text the model reads; they never stop the rollout. Token accounting is in
`bridge` (no re-tokenisation of sampled text) and `episode`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from twinkle_agentic.parsing import ParsedTurn, ToolCall, parse_turn, to_openai_tool_calls
from twinkle_agentic.rollout.actions import (
    env_respond,
    env_step,
    is_env_tool,
    new_env,
    no_tools_message,
    tool_message,
    tool_schemas,
)
from twinkle_agentic.rollout.bridge import TurnBridge
from twinkle_agentic.rollout.episode import Episode
from twinkle_core.errors import InvalidInputError
from twinkle_core.types import SamplingParams, Trajectory

if TYPE_CHECKING:
    from twinkle_agentic.tools.manager import ToolManager


class MultiTurnRollout:
    """Multi-turn rollouts of `sampler` (TorchSampler, vLLMSampler, or a Ray group of either).

    Args:
        sampler: anything with ``sample(prompts, sampling_params, adapter_name=...)``.
        template: a chat template with a ``tokenizer`` (e.g. ``ChatTemplate``) -- or a tokenizer -- that renders
            the episode's turns (``tools``, assistant tool calls, ``tool`` messages).
        tool_manager: the tools every episode may call (besides its env's).
        env: an `Env` class, registered env name or factory; one instance per episode (`env_kwargs` passed).
        sampling_params: per turn; ``max_tokens`` caps each turn, ``num_samples`` must be 1 (give one trajectory
            per wanted episode, e.g. each prompt `num_generations` times).
        max_turns / max_tool_calls: per episode (stop reasons ``max_turns`` / ``max_tool_calls``).
        max_trajectory_tokens: the most tokens an episode may hold (``context_overflow`` when the next turn
            cannot fit; each turn's ``max_tokens`` is cut to the room left).
        stop_on_parse_error / stop_on_tool_timeout: end an episode at its first malformed tool call / tool
            timeout (stop reasons ``parse_error`` / ``tool_timeout``) instead of telling the model and going on.
        rollout_timeout_s: wall-clock limit of one call; episodes still live then stop (``rollout_timeout``).
        trace_dir: write one JSONL file per episode there.
        adapter_name: the sampler's LoRA adapter to sample with.
    """

    def __init__(
        self,
        sampler: Any,
        template: Any,
        *,
        tool_manager: ToolManager | None = None,
        env: Any = None,
        env_kwargs: Mapping[str, Any] | None = None,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        max_turns: int = 6,
        max_tool_calls: int | None = None,
        max_trajectory_tokens: int | None = None,
        stop_on_parse_error: bool = False,
        stop_on_tool_timeout: bool = False,
        rollout_timeout_s: float | None = None,
        trace_dir: str | Path | None = None,
        adapter_name: str | None = None,
    ) -> None:
        params = SamplingParams.model_validate(dict(sampling_params or {}))
        if params.num_samples != 1:
            raise InvalidInputError(
                f'MultiTurnRollout samples one continuation per episode (num_samples={params.num_samples}); repeat '
                'each trajectory num_generations times instead.'
            )
        if max_turns < 1:
            raise InvalidInputError(f'max_turns must be >= 1, got {max_turns}.')
        self.sampler, self.params, self.adapter_name = sampler, params, adapter_name
        self.bridge = TurnBridge(
            getattr(template, 'tokenizer', template), getattr(template, 'chat_template_kwargs', None)
        )
        self.tool_manager, self.env, self.env_kwargs = tool_manager, env, dict(env_kwargs or {})
        self.max_turns, self.max_tool_calls, self.max_tokens = max_turns, max_tool_calls, max_trajectory_tokens
        self.stop_on_parse_error, self.stop_on_tool_timeout = stop_on_parse_error, stop_on_tool_timeout
        self.rollout_timeout_s, self.trace_dir = rollout_timeout_s, trace_dir
        eos = self.bridge.tokenizer.eos_token_id
        self.end_of_turn_ids: set[int] = {eos} if isinstance(eos, int) else set(eos or ())

    # ---- the loop ------------------------------------------------------------------------------------------------
    def __call__(
        self,
        trajectories: Sequence[Mapping[str, Any] | Trajectory],
        *,
        before_turn: Callable[[], int] | None = None,
    ) -> list[dict[str, Any]]:
        """Run one episode per trajectory; returns them in order (`Episode.result`).

        `before_turn`: called before each turn's sample calls (the point where an asynchronous run may load newer
        weights, `twinkle_core.rl.RolloutContext.refresh`); it returns the policy version sampling that turn, and
        every episode then gains ``token_versions`` (one per trainable label) and ``policy_version`` (its oldest).
        """
        episodes = [self._start(i, t) for i, t in enumerate(trajectories)]
        deadline = None if self.rollout_timeout_s is None else time.monotonic() + self.rollout_timeout_s
        for _ in range(self.max_turns):
            live = [e for e in episodes if e.live]
            if not live:
                break
            if deadline is not None and time.monotonic() > deadline:
                for e in live:
                    e.stop('rollout_timeout')
                break
            self._sample_turn(live, None if before_turn is None else before_turn())
            acting = [e for e in live if e.live]
            self._act(acting)
        for e in episodes:
            e.stop('max_turns')
        return [self._finish(e) for e in episodes]

    def _start(self, index: int, trajectory: Mapping[str, Any] | Trajectory) -> Episode:
        data = trajectory.model_dump(exclude_none=True) if isinstance(trajectory, Trajectory) else dict(trajectory)
        if not data.get('messages'):
            raise InvalidInputError(f'trajectory {index} has no messages; a rollout starts from a prompt conversation.')
        messages = [dict(m) for m in data['messages']]
        env = new_env(self.env, self.env_kwargs)
        if env is not None:
            opening = env.reset(data)
            if opening:
                messages.append({'role': 'user', 'content': opening})
        tools = list(data.get('tools') or []) + tool_schemas(env, self.tool_manager)
        ids = self.bridge.prompt_tokens(messages, tools or None)
        return Episode(index, data, [dict(m) for m in messages], messages, tools or None, ids, env=env)

    def _sample_turn(self, live: list[Episode], version: int | None) -> None:
        """One batched sample per distinct turn budget (usually one call); appends each episode's sampled turn."""
        budgets: dict[int, list[Episode]] = {}
        for e in live:
            room = self.params.max_tokens if self.max_tokens is None else self.max_tokens - len(e.input_ids)
            if room < 1:
                e.stop('context_overflow')
                continue
            budgets.setdefault(min(self.params.max_tokens, room), []).append(e)
        for max_tokens, group in budgets.items():
            started = time.monotonic()
            params = self.params.model_copy(update={'max_tokens': max_tokens, 'logprobs': True})
            prompts = [{'input_ids': list(e.input_ids)} for e in group]
            responses = self.sampler.sample(prompts, params, adapter_name=self.adapter_name)
            elapsed = time.monotonic() - started
            for e, response in zip(group, responses):
                self._add_sampled(e, response.sequences[0], max_tokens, elapsed, version)

    def _add_sampled(self, e: Episode, seq: Any, max_tokens: int, elapsed: float, version: int | None) -> None:
        tokens = list(seq.tokens)
        e.add_sampled(tokens, [lp if isinstance(lp, float) else lp[0][1] for lp in seq.logprobs or []], version)
        e.turns += 1
        ended = bool(tokens) and tokens[-1] in self.end_of_turn_ids
        text = self.bridge.decode(tokens[:-1] if ended else tokens)
        e.sampled_text = self.bridge.decode(tokens)
        e.turn_log.append({'turn': e.turns, 'sample_s': round(elapsed, 4), 'tokens': len(tokens), 'text': text})
        e.rendered.append({'role': 'assistant', 'content': text})
        parsed = parse_turn(text)
        message: dict[str, Any] = {'role': 'assistant', 'content': parsed.content if parsed.tool_calls else text}
        if parsed.tool_calls:
            message['tool_calls'] = to_openai_tool_calls(parsed.tool_calls)
        e.messages.append(message)
        e.parsed = parsed
        if seq.stop_reason == 'length':  # cut by the room left in the episode, or by the turn's own budget
            e.stop('context_overflow' if max_tokens < self.params.max_tokens else 'length')

    def _act(self, acting: list[Episode]) -> None:
        """Answer each episode's sampled turn: tool calls, env responses, and the inserted tokens."""
        calls: list[tuple[Episode, ToolCall]] = []
        for e in acting:
            parsed: ParsedTurn = e.parsed
            e.turn_log[-1]['tool_calls'] = [c.name for c in parsed.tool_calls]
            if parsed.errors:
                e.turn_log[-1]['parse_errors'] = parsed.errors
                if self.stop_on_parse_error:
                    e.stop('parse_error')
                    continue
            if not parsed.tool_calls and not parsed.errors:
                self._respond(e, parsed.content)
                continue
            if self.max_tool_calls is not None and e.tool_calls + len(parsed.tool_calls) > self.max_tool_calls:
                e.stop('max_tool_calls')
                continue
            e.tool_calls += len(parsed.tool_calls)
            calls += [(e, call) for call in parsed.tool_calls]
            e.turn_log[-1]['inserted'] = [tool_message(f'Error: {err}') for err in parsed.errors]
        self._run_tools(calls)
        for e in acting:
            inserted = e.turn_log[-1].pop('inserted', None)
            if e.live and inserted:
                self._insert(e, inserted)

    def _respond(self, e: Episode, text: str) -> None:
        if e.env is None:
            e.stop('stop')
            return
        result = env_respond(e.env, text)
        e.turn_log[-1]['reward'] = result.reward
        if result.done:
            e.stop('stop')
        elif result.observation:
            self._insert(e, [{'role': 'user', 'content': result.observation}])
        else:
            e.stop('stop')

    def _run_tools(self, calls: list[tuple[Episode, ToolCall]]) -> None:
        """Env tools in turn (episode state), the others through the ToolManager at once; answers queued as
        ``tool`` messages on each episode's last turn log."""
        managed = [(e, c) for e, c in calls if not is_env_tool(e.env, c.name)]
        outputs = (
            self.tool_manager.call_many([(c.name, c.arguments) for _, c in managed])
            if managed and self.tool_manager is not None
            else []
        )
        results = iter(outputs)
        for e, call in calls:
            log = e.turn_log[-1]
            if is_env_tool(e.env, call.name):
                assert e.env is not None
                step = env_step(e.env, call)
                log.setdefault('rewards', []).append(step.reward)
                log['inserted'].append(tool_message(step.observation, call.name))
                if step.done:
                    e.stop('stop')
                continue
            if self.tool_manager is None:
                log['inserted'].append(no_tools_message(call.name))
                continue
            out = next(results)
            log.setdefault('tool_results', []).append(
                {'name': call.name, 'ok': out.ok, 'error': out.error, 'elapsed_s': round(out.elapsed_s, 4)}
            )
            log['inserted'].append(tool_message(out.output, call.name))
            if out.error == 'timeout' and self.stop_on_tool_timeout:
                e.stop('tool_timeout')

    def _insert(self, e: Episode, inserted: list[dict[str, Any]]) -> None:
        """Append inserted turns (labels -100) and the next generation prompt, unless they overflow the limit."""
        tokens = self.bridge.tokens(e.rendered, inserted, e.tools, e.sampled_text)
        if self.max_tokens is not None and len(e.input_ids) + len(tokens) >= self.max_tokens:
            e.stop('context_overflow')
            return
        e.add_inserted(tokens)
        e.rendered += inserted
        e.messages += inserted

    def _finish(self, e: Episode) -> dict[str, Any]:
        reward = e.env.evaluate({**e.trajectory, 'messages': e.messages}) if e.env else None
        result = e.result(reward)
        if self.trace_dir is not None:
            e.write_trace(self.trace_dir, result, self.bridge.decode)
        return result
