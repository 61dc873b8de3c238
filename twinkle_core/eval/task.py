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
    """Held-out prompts + a scorer + `sampling` (greedy by default). Subclasses set `name`, implement `prompts`,
    and `score_one` (one completion at a time) or `score` (all of them at once)."""

    name: str = 'task'
    sampling: SamplingParams = SamplingParams(max_tokens=32, temperature=0.0)

    @abstractmethod
    def prompts(self) -> list[dict[str, Any]]:
        """The task's prompts (deterministic: the same list on every call)."""

    def score(self, trajectories: Sequence[dict[str, Any]]) -> list[Score]:
        """One `Score` per trajectory (a prompt with its completion as the last, assistant, message)."""
        return [self.score_one(completion_of(t), t) for t in trajectories]

    def score_one(self, completion: str, trajectory: dict[str, Any]) -> Score:
        """The `Score` of one `completion` of `trajectory`'s prompt."""
        raise NotImplementedError(f'{type(self).__name__} implements score() or score_one()')


class PromptListTask(EvalTask):
    """A task whose prompts are a list built once (`prompt_list`), answered with `sampling`."""

    def __init__(self, prompt_list: list[dict[str, Any]], sampling: SamplingParams) -> None:
        self._prompts, self.sampling = prompt_list, sampling

    def prompts(self) -> list[dict[str, Any]]:
        return list(self._prompts)


def completion_of(trajectory: dict[str, Any]) -> str:
    """The completion a scored trajectory carries: the content of its last (assistant) message."""
    messages = trajectory.get('messages') or []
    if not messages or messages[-1].get('role') != 'assistant':
        raise ValueError('a scored trajectory ends with the assistant message holding the completion')
    return str(messages[-1].get('content') or '')
