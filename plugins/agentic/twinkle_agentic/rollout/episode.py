"""One episode of a multi-turn rollout: its token accounting and its record, and the trajectory it becomes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from twinkle_core.env.base import Env
from twinkle_core.types import IGNORE_INDEX

#: Why an episode ended.
EpisodeStop = Literal[
    'stop', 'length', 'max_turns', 'max_tool_calls', 'context_overflow', 'parse_error', 'tool_timeout',
    'rollout_timeout',
]  # fmt: skip
#: Stop reasons that cut an episode short (`truncated`): it did not end by the policy's or the env's choice.
TRUNCATING: frozenset[str] = frozenset(
    {'length', 'max_turns', 'max_tool_calls', 'context_overflow', 'parse_error', 'tool_timeout', 'rollout_timeout'}
)


@dataclass
class Episode:
    """Mutable state of one episode. ``input_ids``/``labels`` grow turn by turn: sampled tokens are labelled with
    themselves (trainable) and carry their behaviour log-probs; inserted tokens get -100 and no log-prob."""

    index: int
    trajectory: dict[str, Any]
    messages: list[dict[str, Any]]  # the conversation (OpenAI shape: assistant `tool_calls`, `tool` turns)
    rendered: list[dict[str, Any]]  # the same turns as the template renders them (sampled text verbatim)
    tools: list[dict[str, Any]] | None
    input_ids: list[int]
    env: Env | None = None
    labels: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] | None = None  # the policy version of each sampled token, when the rollout tracks it
    turns: int = 0
    tool_calls: int = 0
    stop_reason: EpisodeStop | None = None
    turn_log: list[dict[str, Any]] = field(default_factory=list)
    sampled_text: str = ''  # the last sampled turn, decoded with its end-of-turn token
    parsed: Any = None  # the last sampled turn's `ParsedTurn` (tool calls), until the rollout acts on it

    def __post_init__(self) -> None:
        self.labels = [IGNORE_INDEX] * len(self.input_ids)

    @property
    def live(self) -> bool:
        return self.stop_reason is None

    def add_sampled(self, tokens: Sequence[int], logprobs: Sequence[float], version: int | None = None) -> None:
        self.input_ids += tokens
        self.labels += tokens
        self.logprobs += [float(lp) for lp in logprobs]
        if version is not None:
            self.token_versions = (self.token_versions or []) + [version] * len(tokens)

    def add_inserted(self, tokens: Sequence[int]) -> None:
        self.input_ids += tokens
        self.labels += [IGNORE_INDEX] * len(tokens)

    def stop(self, reason: EpisodeStop) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason

    def result(self, reward: float | None) -> dict[str, Any]:
        """The trajectory with the episode's fields: trainable by `forward_backward` as is (``old_logps`` from
        ``logprobs``: one per trainable label, in order)."""
        reason = self.stop_reason or 'max_turns'
        out = {
            **self.trajectory,
            'input_ids': list(self.input_ids),
            'labels': list(self.labels),
            'logprobs': list(self.logprobs),
            'messages': self.messages,
            'turns': self.turns,
            'tool_calls': self.tool_calls,
            'stop_reason': reason,
            'truncated': reason in TRUNCATING,
            'turn_log': self.turn_log,
        }
        if reward is not None:
            out['reward'] = reward
        if self.token_versions is not None:
            out['token_versions'] = list(self.token_versions)
            out['policy_version'] = min(self.token_versions, default=None)
        return out

    def write_trace(self, trace_dir: str | Path, result: dict[str, Any], decode: Any) -> Path:
        """One JSONL file for the episode: a line per turn (its log), then the final record with the decoded
        conversation text."""
        path = Path(trace_dir) / f'episode_{self.index:05d}.jsonl'
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open('w') as f:
            for entry in self.turn_log:
                f.write(json.dumps(entry, default=str) + '\n')
            summary = {k: v for k, v in result.items() if k not in ('input_ids', 'labels', 'logprobs')}
            f.write(json.dumps({**summary, 'text': decode(self.input_ids)}, default=str) + '\n')
        return path
