"""`RolloutBuffer`: the bounded, staleness-checked queue between rollout workers and the trainer."""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable

from twinkle_core.rl.rollout_group import RolloutGroup


class BufferClosed(Exception):
    """The run ended (or failed) while a thread waited on the buffer."""


class RolloutBuffer:
    """Groups in arrival order. The trainer `take`\\ s a step's groups as soon as that many fresh ones are in
    (streaming: it never waits for a slower group of the same step); a group older than ``step - max_staleness``
    is dropped and counted. Workers ask `position()` -- how many groups the trainer will have consumed before the
    next one put -- to decide which policy version their next groups need (see `AsyncRLDriver`).
    """

    def __init__(self, groups_per_step: int, max_staleness: int) -> None:
        if groups_per_step < 1:
            raise ValueError(f'groups_per_step must be >= 1, got {groups_per_step}.')
        if max_staleness < 0:
            raise ValueError(f'max_staleness must be >= 0, got {max_staleness}.')
        self.groups_per_step, self.max_staleness = groups_per_step, max_staleness
        self.cv = threading.Condition()
        self._groups: deque[RolloutGroup] = deque()
        self.consumed = 0  # groups the trainer took
        self.dropped = 0  # groups too stale to train on
        self.closed: BaseException | None = None

    def position(self) -> int:
        """Groups consumed plus queued: the index the next group put will have in the trainer's stream."""
        with self.cv:
            return self.consumed + len(self._groups)

    def put(self, groups: list[RolloutGroup]) -> None:
        with self.cv:
            self._raise_if_closed()
            self._groups.extend(groups)
            self.cv.notify_all()

    def take(self, step: int) -> tuple[list[RolloutGroup], int]:
        """Block until `groups_per_step` groups with ``policy_version >= step - max_staleness`` are in; returns
        them and how many older ones were dropped on the way."""
        oldest = step - self.max_staleness
        taken: list[RolloutGroup] = []
        dropped = 0
        with self.cv:
            while len(taken) < self.groups_per_step:
                self.wait_for(lambda: bool(self._groups))
                group = self._groups.popleft()
                if group.policy_version is not None and group.policy_version < oldest:
                    dropped += 1
                    continue
                taken.append(group)
            self.consumed += len(taken)
            self.dropped += dropped
            self.cv.notify_all()
        return taken, dropped

    def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait (holding ``cv``) until `predicate` holds; raises `BufferClosed` when the run ends meanwhile."""
        while not predicate():
            self._raise_if_closed()
            self.cv.wait(timeout=1.0)
        self._raise_if_closed()

    def notify(self) -> None:
        """Wake the threads waiting on the buffer (something they wait for, e.g. a policy version, changed)."""
        with self.cv:
            self.cv.notify_all()

    def close(self, reason: BaseException | None = None) -> None:
        with self.cv:
            self.closed = reason or BufferClosed('the run ended')
            self.cv.notify_all()

    def _raise_if_closed(self) -> None:
        if self.closed is not None:
            raise BufferClosed(str(self.closed)) from self.closed
