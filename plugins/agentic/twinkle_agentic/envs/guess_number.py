"""GuessNumberEnv: find a secret integer in [low, high] with 'too low' / 'too high' hints (binary search wins).

The policy guesses with the ``guess`` tool (``{"number": n}``) or, so that a model without tool calls can still
play, by answering in plain text: `respond` reads the last integer in the text as its guess (a reply with no
integer is told so). Every action, valid or not, uses one of `max_guesses`, so an episode always ends. A correct
guess ends the episode with reward 1.0; running out of guesses ends it with 0. `invalid_penalty` (default 0) is
the optional shaping: the reward of a malformed, out-of-range or unknown action is ``-invalid_penalty``.
``tool=False`` offers no ``guess`` tool (plain-text guesses only: no tool schema in the prompt, for small models).
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from twinkle_core.env import Env, StepResult
from twinkle_core.tool import Tool

_INTEGER = re.compile(r'(?<![\w.])-?\d+(?![\w.]*\d)')


class GuessTool(Tool):
    """The ``guess`` tool of a `GuessNumberEnv`: its calls go to the env's `step` (not run in a sandbox)."""

    name: ClassVar[str] = 'guess'
    description: ClassVar[str] = 'Guess the secret number. Answers "too low", "too high" or "correct".'
    parameters: ClassVar[dict[str, Any]] = {
        'type': 'object',
        'properties': {'number': {'type': 'integer', 'description': 'your guess'}},
        'required': ['number'],
    }
    sandboxed = False

    def __init__(self, env: GuessNumberEnv) -> None:
        self._env = env

    def __call__(self, **arguments: Any) -> str:
        """The observation of ``env.step('guess', arguments)`` (a rollout calls `step` itself, keeping rewards)."""
        return self._env.step(self.name, arguments).observation


def _as_int(value: Any) -> int | None:
    """`value` as an integer guess: an int, an integral float, or a string holding one; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r'\s*[-+]?\d+\s*', value):
        return int(value)
    return None


class GuessNumberEnv(Env):
    """Guess a secret in [`low`, `high`] within `max_guesses`. The secret is ``user_data['secret']`` when the
    trajectory has one (``user_data`` may also set ``low``, ``high``, ``max_guesses``), else drawn from a
    `random.Random(seed)` made once per env. `intro`: whether `reset` returns the rules as a user turn (None: only
    when the prompt has no user message)."""

    def __init__(
        self,
        low: int = 1,
        high: int = 100,
        max_guesses: int = 7,
        seed: int | None = None,
        intro: bool | None = None,
        invalid_penalty: float = 0.0,
        tool: bool = True,
    ) -> None:
        super().__init__()
        if low > high or max_guesses < 1:
            raise ValueError(f'GuessNumberEnv needs low <= high and max_guesses >= 1, got {low}, {high}, {max_guesses}')
        self.low, self.high, self.max_guesses = low, high, max_guesses
        self.intro = intro
        self.invalid_penalty = invalid_penalty
        self.tool = tool
        self.rng = random.Random(seed)
        self.secret: int | None = None
        self.guesses: list[int | None] = []
        self.done = False

    def tools(self) -> list[Tool]:
        return [GuessTool(self)] if self.tool else []

    def rules(self) -> str:
        """The rules, as told to the policy."""
        how = 'Guess with the `guess` tool, or reply with a number. ' if self.tool else 'Reply with a number. '
        return (
            f"I'm thinking of an integer between {self.low} and {self.high}. You have {self.max_guesses} guesses. "
            f"{how}After each guess I'll say whether it is too low, too high or correct."
        )

    def reset(self, trajectory: dict[str, Any]) -> str | None:
        """Pick the secret; returns `rules()` when `intro` says so."""
        data = trajectory.get('user_data') or {}
        self.low = int(data.get('low', self.low))
        self.high = int(data.get('high', self.high))
        self.max_guesses = int(data.get('max_guesses', self.max_guesses))
        if data.get('secret') is not None:
            secret = _as_int(data['secret'])
            if secret is None or not self.low <= secret <= self.high:
                raise ValueError(f"user_data['secret'] must be an integer in [{self.low}, {self.high}]")
            self.secret = secret
        else:
            self.secret = self.rng.randint(self.low, self.high)
        self.guesses, self.done, self.rewards = [], False, []
        intro = self.intro
        if intro is None:
            intro = not any(m.get('role') == 'user' for m in trajectory.get('messages') or [])
        return self.rules() if intro else None

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {'guesses': len(self.guesses), 'secret': self.secret, **extra}

    def _play(self, number: int | None, problem: str = '') -> StepResult:
        """Use one guess: `number`, or an invalid action described by `problem`."""
        if self.secret is None:
            raise RuntimeError('GuessNumberEnv.step before reset')
        if self.done:
            return StepResult('The game is over.', 0.0, True, self._info(result='over'))
        if number is not None and not self.low <= number <= self.high:
            problem = f'{number} is out of range: guess an integer between {self.low} and {self.high}.'
            number = None
        self.guesses.append(number)
        left = self.max_guesses - len(self.guesses)
        if number == self.secret:
            self.done = True
            return StepResult(f'{number} is correct!', 1.0, True, self._info(result='correct'))
        if number is None:
            reward, result, text = -self.invalid_penalty, 'invalid', problem
        else:
            reward, result = 0.0, 'too low' if number < self.secret else 'too high'
            text = f'{number} is {result}.'
        if left <= 0:
            self.done = True
            text += f' No guesses left; the number was {self.secret}.'
            return StepResult(text, reward, True, self._info(result=result))
        text += f' {left} guess{"es" if left > 1 else ""} left.'
        return StepResult(text, reward, False, self._info(result=result))

    def step(self, tool_name: str, arguments: dict[str, Any]) -> StepResult:
        """A ``guess`` call; an unknown tool or a bad ``number`` is an invalid action (it uses a guess)."""
        if tool_name != 'guess':
            return self._play(None, f'Unknown tool {tool_name!r}; the only tool is `guess`.')
        if not isinstance(arguments, dict) or 'number' not in arguments:
            return self._play(None, 'The guess tool needs an integer argument "number".')
        number = _as_int(arguments['number'])
        if number is None:
            return self._play(None, f'"number" must be an integer, got {arguments["number"]!r}.')
        return self._play(number)

    def respond(self, text: str) -> StepResult:
        """A plain-text reply: its last integer is the guess; a reply without one is an invalid action."""
        found = _INTEGER.findall(text or '')
        if not found:
            return self._play(None, 'No number found in your reply: answer with an integer or call `guess`.')
        return self._play(int(found[-1]))
