"""CalculatorTaskEnv: "compute <expression>" with a ``calculator`` tool the env answers itself.

The expression is ``user_data['expression']`` when the trajectory has one, else generated from the env's seeded
RNG (products and sums of 3-4 digit numbers, e.g. ``4821 * 377 + 96``). The ``calculator`` tool
(``{"expression": "..."}``) is evaluated in this process by `arith.evaluate` (an `ast` walk, never `eval`); it
gives reward 0 and does not end the episode. The final answer is the assistant's plain-text reply (`respond`):
reward 1.0 when its number (the last ``\\boxed{}`` or else the last number, see `arith.extract_number`) equals the
true value (exactly; a non-whole value within a relative 1e-6), else 0. Every result's ``info`` holds
``tool_calls``, the number of calls so far.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any, ClassVar

from twinkle_agentic.envs import arith
from twinkle_core.env import Env, StepResult
from twinkle_core.tool import Tool

_FORMS = ('{a} * {b}', '{a} * {b} + {c}', '{a} * {b} - {c}', '({a} + {b}) * {c}', '{a} * {b} * {c}')


class CalculatorTool(Tool):
    """The ``calculator`` tool of a `CalculatorTaskEnv`: its calls go to the env's `step` (not run in a sandbox)."""

    name: ClassVar[str] = 'calculator'
    description: ClassVar[str] = 'Evaluate an arithmetic expression (numbers, parentheses, + - * / // % **).'
    parameters: ClassVar[dict[str, Any]] = {
        'type': 'object',
        'properties': {'expression': {'type': 'string', 'description': 'e.g. "1234 * 567"'}},
        'required': ['expression'],
    }
    sandboxed = False

    def __init__(self, env: CalculatorTaskEnv) -> None:
        self._env = env

    def __call__(self, **arguments: Any) -> str:
        """The observation of ``env.step('calculator', arguments)`` (a rollout calls `step` itself)."""
        return self._env.step(self.name, arguments).observation


def generate_expression(rng: random.Random) -> str:
    """A random task: 2-3 operands of 3-4 digits in one of a few forms that need a multiplication."""
    form = rng.choice(_FORMS)
    operands = {k: rng.randint(100, 9999) for k in 'abc'}
    if form.endswith('* {c}') and '(' not in form:  # three factors: keep the third small
        operands['c'] = rng.randint(11, 99)
    return form.format(**operands)


def _matches(given: Fraction, answer: Fraction) -> bool:
    """Exact for a whole-number answer; within a relative 1e-6 otherwise (a decimal cannot be written exactly)."""
    if answer.denominator == 1:
        return given == answer
    return abs(given - answer) <= Fraction(1, 10**6) * max(Fraction(1), abs(answer))


class CalculatorTaskEnv(Env):
    """Compute an expression, with a calculator. `seed`: the RNG of generated expressions (made once per env);
    `max_tool_calls`: calls beyond it end the episode with reward 0; `intro`: whether `reset` returns the task as a
    user turn (None: only when the prompt has no user message)."""

    def __init__(self, seed: int | None = None, max_tool_calls: int = 8, intro: bool | None = None) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.max_tool_calls = max_tool_calls
        self.intro = intro
        self.expression = ''
        self.answer: Fraction | None = None
        self.tool_calls = 0
        self.done = False

    def tools(self) -> list[Tool]:
        return [CalculatorTool(self)]

    def task(self) -> str:
        """The task, as told to the policy."""
        return f'Compute {self.expression}. You may use the `calculator` tool. Reply with the final answer as a number.'

    def reset(self, trajectory: dict[str, Any]) -> str | None:
        """Fix the expression and its true value; returns `task()` when `intro` says so."""
        data = trajectory.get('user_data') or {}
        expression = data.get('expression')
        self.expression = str(expression) if expression is not None else generate_expression(self.rng)
        self.answer = arith.evaluate(self.expression)  # ArithError: the dataset row is broken
        self.tool_calls, self.done, self.rewards = 0, False, []
        intro = self.intro
        if intro is None:
            intro = not any(m.get('role') == 'user' for m in trajectory.get('messages') or [])
        return self.task() if intro else None

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {'tool_calls': self.tool_calls, **extra}

    def step(self, tool_name: str, arguments: dict[str, Any]) -> StepResult:
        """A ``calculator`` call: the value (or an error message) as the observation, reward 0."""
        if self.answer is None:
            raise RuntimeError('CalculatorTaskEnv.step before reset')
        if self.done:
            return StepResult('The task is over.', 0.0, True, self._info())
        self.tool_calls += 1
        if self.tool_calls > self.max_tool_calls:
            self.done = True
            return StepResult(f'Too many tool calls (limit {self.max_tool_calls}).', 0.0, True, self._info())
        if tool_name != 'calculator':
            return StepResult(f'Error: unknown tool {tool_name!r}; the only tool is `calculator`.', info=self._info())
        expression = arguments.get('expression') if isinstance(arguments, dict) else None
        if not isinstance(expression, str):
            return StepResult('Error: the calculator needs a string argument "expression".', info=self._info())
        try:
            value = arith.format_number(arith.evaluate(expression))
        except arith.ArithError as exc:
            return StepResult(f'Error: {exc}', info=self._info())
        return StepResult(value, info=self._info())

    def respond(self, text: str) -> StepResult:
        """The final answer: reward 1.0 when its number equals the true value, else 0; the episode ends."""
        if self.answer is None:
            raise RuntimeError('CalculatorTaskEnv.respond before reset')
        if self.done:
            return StepResult('The task is over.', 0.0, True, self._info())
        self.done = True
        given = arith.extract_number(text or '')
        correct = given is not None and _matches(given, self.answer)
        info = self._info(
            correct=correct,
            expected=arith.format_number(self.answer),
            answer=None if given is None else arith.format_number(given),
        )
        return StepResult('', 1.0 if correct else 0.0, True, info)
