"""Errors of the Ray runtime. Each names the group, the rank and the method involved."""

from __future__ import annotations

from twinkle_core.errors import TwinkleError


class RemoteCallError(TwinkleError):
    """A method call failed inside an actor of a device group.

    `group`, `rank` and `method` say where; `remote_traceback` is the actor-side traceback. The group that raised
    it is marked broken (its other ranks may be stuck in a collective): `twinkle_core.shutdown()` releases it.
    """

    def __init__(self, group: str, rank: int, method: str, message: str, remote_traceback: str = '') -> None:
        self.group, self.rank, self.method, self.remote_traceback = group, rank, method, remote_traceback
        text = f'{method} failed in actor (group={group!r}, rank={rank}): {message}'
        if remote_traceback:
            text += f'\n--- remote traceback (group={group!r}, rank={rank}) ---\n{remote_traceback.rstrip()}'
        super().__init__(text)

    def __reduce__(self):  # keep the structured fields when Ray pickles the exception back to the driver
        return (type(self), (self.group, self.rank, self.method, self._message(), self.remote_traceback))

    def _message(self) -> str:
        head = str(self).split('\n', 1)[0]
        return head.split(': ', 1)[1] if ': ' in head else head


class GroupBrokenError(TwinkleError):
    """A call to a device group after one of its calls failed."""
