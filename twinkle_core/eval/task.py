"""The EvalTask interface (kind ``task``): held-out prompts, a scorer, and the sampling settings to answer them with.

A task is data and rules only: `twinkle_core.eval.runner.evaluate` samples its prompts through any `Sampler` and
turns its scores into metrics (`twinkle_core.eval.metrics`). `prompts()` returns `Trajectory` dicts (``messages``
plus the reference fields the scorer reads, e.g. ``ground_truth``), the same on every call; `score` receives each
prompt with one sampled completion appended as the assistant's last message (what the rewards take) and returns a
`Score` per trajectory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

from twinkle_core.types import SamplingParams


@dataclass(frozen=True)
class Score:
    """One completion's result: `correct` (what accuracy and pass@k count), `reward` (the task's reward, 1.0/0.0 when
    it has no finer one) and `formatted` (the answer has the required form, whether or not it is right)."""

    correct: bool
    reward: float
    formatted: bool


class EvalTask(ABC):
    """Held-out prompts + a scorer + `sampling` (greedy by default). Subclasses set `name` and implement both."""

    name: str = 'task'
    sampling: SamplingParams = SamplingParams(max_tokens=32, temperature=0.0)

    @abstractmethod
    def prompts(self) -> list[dict[str, Any]]:
        """The task's prompts (deterministic: the same list on every call)."""

    @abstractmethod
    def score(self, trajectories: Sequence[dict[str, Any]]) -> list[Score]:
        """One `Score` per trajectory (a prompt with its completion as the last, assistant, message)."""


def completion_of(trajectory: dict[str, Any]) -> str:
    """The completion a scored trajectory carries: the content of its last (assistant) message."""
    messages = trajectory.get('messages') or []
    if not messages or messages[-1].get('role') != 'assistant':
        raise ValueError('a scored trajectory ends with the assistant message holding the completion')
    return str(messages[-1].get('content') or '')
