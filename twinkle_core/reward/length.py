"""Length rewards: DAPO's soft overlong punishment."""

from __future__ import annotations

from typing import Any, Sequence

from twinkle_core.errors import InvalidInputError
from twinkle_core.reward.base import Reward


class OverlongPenaltyReward(Reward):
    """DAPO's soft overlong punishment (Yu et al., 2025, eq. 13), to add to a task reward. With ``L = max_length``
    and ``B = buffer`` (the last B tokens before the limit), a completion of ``n`` tokens gets::

        0                 n <= L - B
        (L - B - n) / B   L - B < n <= L      (falls linearly from 0 to -1 over the buffer)
        -1                n > L

    Lengths come in ``completion_lengths=`` (one token count per trajectory, as the sampler returned them);
    `scale` multiplies the penalty."""

    def __init__(self, max_length: int, buffer: int, *, scale: float = 1.0) -> None:
        if not 0 < buffer <= max_length:
            raise InvalidInputError(
                f'OverlongPenaltyReward: need 0 < buffer <= max_length, got buffer={buffer}, max_length={max_length}.'
            )
        self.max_length, self.buffer, self.scale = int(max_length), int(buffer), float(scale)

    def __call__(
        self, trajectories: Sequence[dict[str, Any]], *, completion_lengths: Sequence[int] | None = None, **kwargs: Any
    ) -> list[float]:
        if completion_lengths is None or len(completion_lengths) != len(trajectories):
            got = 'none' if completion_lengths is None else f'{len(completion_lengths)}'
            raise InvalidInputError(
                f'OverlongPenaltyReward needs completion_lengths= (one token count per trajectory): got {got} for '
                f'{len(trajectories)} trajectories.'
            )
        start = self.max_length - self.buffer
        out = []
        for n in completion_lengths:
            if n <= start:
                out.append(0.0)
            elif n <= self.max_length:
                out.append(self.scale * (start - n) / self.buffer)
            else:
                out.append(-self.scale)
        return out
