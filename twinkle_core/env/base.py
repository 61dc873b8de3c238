"""The Env interface: an episode's state and rules in a multi-turn rollout.

A rollout makes one env per episode (kind ``env``, resolved by name with its keyword arguments), calls
`reset(trajectory)` with the episode's prompt, then, turn by turn, `step(tool_name, arguments)` for every tool call
the policy makes on one of the env's `tools()`, or `respond(text)` when the policy answers without a tool call.
Each returns a `StepResult`: the observation the policy sees next (inserted as a tool or user turn), a reward,
and whether the episode is over. `evaluate(trajectory)` gives the final reward of a finished episode (default: the
sum of the step rewards).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from twinkle_core.tool.base import Tool


@dataclass
class StepResult:
    """What an env answers to one action. `observation`: text shown to the policy next ('' for nothing);
    `reward`: this step's reward; `done`: the episode is over; `info`: anything to record with the episode."""

    observation: str = ''
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """One episode's environment. Subclasses implement `reset` and `step`; `respond`, `tools` and `evaluate`
    have defaults."""

    def __init__(self) -> None:
        self.rewards: list[float] = []

    @abstractmethod
    def reset(self, trajectory: dict[str, Any]) -> str | None:
        """Start the episode for `trajectory` (its ``messages`` are the prompt, other keys the task's data, e.g.
        ``user_data``). Returns text appended as a user turn before the first sample, or None."""

    @abstractmethod
    def step(self, tool_name: str, arguments: dict[str, Any]) -> StepResult:
        """The policy called the env's tool `tool_name` with `arguments`."""

    def respond(self, text: str) -> StepResult:
        """The policy answered `text` without a tool call. Default: the episode ends, no reward."""
        return StepResult(done=True)

    def tools(self) -> list[Tool]:
        """The tools the policy may call on this env (their calls come to `step`). Default: none."""
        return []

    def evaluate(self, trajectory: dict[str, Any]) -> float:
        """Final reward of the finished episode `trajectory` (default: the sum of the rewards `record`ed)."""
        return float(sum(self.rewards))

    def record(self, result: StepResult) -> StepResult:
        """Keep `result`'s reward for `evaluate` (the rollout calls it on every step's result)."""
        self.rewards.append(float(result.reward))
        return result
