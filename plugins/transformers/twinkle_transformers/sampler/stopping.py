"""When a sequence stops: EOS / stop token ids, stop strings, or the token budget.

Semantics (the Tinker convention, also what tinker-cookbook renderers expect): the token that triggers a stop is
*kept* -- a stop token id is the last returned token, and for a stop string the sequence is cut right after the
token that completes the string (a token may carry characters past the end of the string; tokens are never
split). Tokens, logprobs and decoded text are always cut at the same place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

StopReason = Literal['stop', 'length']
Decode = Callable[[list[int]], str]


@dataclass(frozen=True)
class StopCondition:
    """`stop_token_ids` always include the model's EOS ids. `stop_strings` need `decode` (a tokenizer)."""

    max_tokens: int
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    decode: Decode | None = None
    _window: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.stop_strings and self.decode is None:
            raise ValueError('stop strings need a tokenizer to decode tokens; set a template or tokenizer')
        # A string of n UTF-8 bytes is completed within its last n tokens (every token carries >= 1 byte);
        # one extra token covers a partial character at the front of the window.
        longest = max((len(s.encode()) for s in self.stop_strings), default=0)
        object.__setattr__(self, '_window', longest + 1)

    def check(self, generated: list[int]) -> StopReason | None:
        """Reason to stop after the newest token of `generated`, or None to continue."""
        if generated[-1] in self.stop_token_ids:
            return 'stop'
        if self.stop_strings:
            assert self.decode is not None
            tail = self.decode(generated[-self._window :])
            if any(s in tail for s in self.stop_strings):
                return 'stop'
        if len(generated) >= self.max_tokens:
            return 'length'
        return None
