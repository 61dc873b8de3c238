"""DAPO's dynamic sampling: keep only prompt groups whose rewards differ, and sample more until the batch is full.

A group whose completions all got the same reward has zero group-relative advantage: it costs a forward and
backward and teaches nothing (and shrinks the effective batch as a policy gets good). `fill_informative_groups`
draws groups, drops those, and draws again until `target` informative groups are kept or `max_draws` calls were
made; what it did is counted in `DynamicSamplingStats` (log it: a run whose batches stop filling has saturated its
prompts).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Callable, Protocol, Sequence, TypeVar

from twinkle_core.errors import InvalidInputError

logger = logging.getLogger(__name__)


class ScoredGroup(Protocol):
    rewards: Sequence[float]


Group = TypeVar('Group', bound=ScoredGroup)


@dataclass
class DynamicSamplingStats:
    """``drawn``: groups sampled; ``kept``: informative groups returned; ``dropped``: groups whose rewards all
    agreed; ``surplus``: informative groups beyond `target` (discarded); ``draws``: sampling calls; ``full``:
    whether `target` groups were kept."""

    drawn: int = 0
    kept: int = 0
    dropped: int = 0
    surplus: int = 0
    draws: int = 0
    full: bool = False

    def as_metrics(self, prefix: str = 'dynamic_sampling/') -> dict[str, float]:
        return {f'{prefix}{k}': float(v) for k, v in asdict(self).items()}


def is_informative(rewards: Sequence[float], tolerance: float = 0.0) -> bool:
    """Whether a group's rewards differ by more than `tolerance` (so its group-relative advantages are not all 0)."""
    return bool(rewards) and max(rewards) - min(rewards) > tolerance


def fill_informative_groups(
    draw: Callable[[int], list[Group]],
    target: int,
    *,
    max_draws: int = 8,
    tolerance: float = 0.0,
) -> tuple[list[Group], DynamicSamplingStats]:
    """Call ``draw(n)`` (sample and score ``n`` new prompt groups) until `target` groups whose rewards differ are
    kept, asking each time for as many as are still missing, at most `max_draws` calls; returns the first `target`
    informative groups (fewer when the calls ran out: ``stats.full`` is False and a warning says so)."""
    if target < 1 or max_draws < 1:
        raise InvalidInputError(
            f'fill_informative_groups: target and max_draws must be >= 1, got {target}, {max_draws}.'
        )
    kept: list[Group] = []
    stats = DynamicSamplingStats()
    while len(kept) < target and stats.draws < max_draws:
        groups = draw(target - len(kept))
        stats.draws += 1
        stats.drawn += len(groups)
        for group in groups:
            if is_informative(group.rewards, tolerance):
                kept.append(group)
            else:
                stats.dropped += 1
    stats.surplus = max(0, len(kept) - target)
    kept = kept[:target]
    stats.kept, stats.full = len(kept), len(kept) == target
    if not stats.full:
        logger.warning(
            'dynamic sampling: %d of %d groups with differing rewards after %d draws (%d groups dropped: every '
            'completion got the same reward); training on a smaller batch.',
            stats.kept,
            target,
            stats.draws,
            stats.dropped,
        )
    return kept, stats
