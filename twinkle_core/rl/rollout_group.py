"""What a rollout worker hands the trainer: `RolloutGroup`, and what the driver hands the worker: `RolloutContext`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class RolloutGroup:
    """One prompt's scored rollouts (GRPO: its `num_generations` episodes), trained together.

    ``rows``: trainable rows (``input_ids``, ``labels``, behaviour log-probs ``old_logps``...) as the worker built
    them; ``rewards``: one per row. ``policy_version``: the OLDEST policy version that sampled any of its tokens
    (None: the driver fills in the version the worker ran when the call began). ``token_versions``: per row, the
    version of each trainable token, for partial rollouts whose episodes outlive a weight update (None when every
    token is of ``policy_version``). ``info``: anything else (prompt, stop reasons) for metrics.
    """

    rows: list[dict[str, Any]]
    rewards: list[float]
    policy_version: int | None = None
    token_versions: list[list[int]] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.rewards):
            raise ValueError(f'RolloutGroup: {len(self.rows)} rows but {len(self.rewards)} rewards.')
        if self.token_versions is not None and self.policy_version is None:
            flat = [v for row in self.token_versions for v in row]
            self.policy_version = min(flat) if flat else None


@dataclass
class RolloutContext:
    """Passed to every worker call. ``call_index``: 0, 1, 2... (seed sampling with it for reproducible runs);
    ``version``: the policy version the sampler runs as the call begins. ``refresh()``: with partial rollouts
    ``'continue'``, loads newer weights if any were published (call it between sample calls, e.g. between the
    turns of a multi-turn rollout) and returns the version now running; with ``'finish'`` it changes nothing."""

    call_index: int
    version: int
    refresh: Callable[[], int]


def rows_with_advantages(groups: list[RolloutGroup], advantage_fn: Callable[..., list[float]]) -> list[dict[str, Any]]:
    """Every group's rows, in order, each with its ``advantage`` from ``advantage_fn(group.rewards,
    group_size=len(group.rewards))`` (e.g. `GRPOAdvantage`: relative to its own group). The rows are copies."""
    return [
        {**row, 'advantage': advantage}
        for group in groups
        for row, advantage in zip(group.rows, advantage_fn(group.rewards, group_size=len(group.rewards)))
    ]
