"""Evaluation tasks of agentic behaviour (kind ``task``, for `twinkle_core.eval.evaluate`).

`CalculatorCallTask`: the first turn of the calculator task (`envs.calculator_task`). The prompt offers the
``calculator`` tool and asks to compute an expression that needs a multiplication of 3-4 digit numbers; the turn is
*formatted* when it makes a well-formed ``calculator`` call (the tool-call rate), and *correct* when it gets the
value right: a call whose expression evaluates to it, or a direct answer of that number. A sampler that returns
text (a local one) is parsed like a rollout parses it (`parsing.parse_turn`); an OpenAI-compatible endpoint's
assistant message with ``tool_calls`` (`rollout.OpenAISampler`) is read as it is. The whole episode, tool answer
and final reply included, is what `rollout.MultiTurnRollout` with `CalculatorTaskEnv` plays and scores.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from twinkle_agentic.envs import arith
from twinkle_agentic.envs.calculator_task import CalculatorTaskEnv, CalculatorTool, generate_expression
from twinkle_agentic.parsing import parse_openai_message
from twinkle_core.eval.task import PromptListTask, Score
from twinkle_core.types import SamplingParams


class CalculatorCallTask(PromptListTask):
    """`size` calculator tasks (expressions drawn with `seed`), answered greedily in at most `max_tokens` tokens."""

    name = 'calculator_call'

    def __init__(self, size: int = 50, *, seed: int = 1234, max_tokens: int = 64) -> None:
        rng = random.Random(seed)
        env = CalculatorTaskEnv(intro=True)
        tools = [CalculatorTool(env).schema()]
        prompts = []
        for _ in range(size):
            expression = generate_expression(rng)
            task = env.reset({'user_data': {'expression': expression}})
            prompts.append(
                {
                    'messages': [{'role': 'user', 'content': task}],
                    'tools': tools,
                    'user_data': {'expression': expression},
                    'ground_truth': arith.format_number(arith.evaluate(expression)),
                }
            )
        super().__init__(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0))

    def score(self, trajectories: Sequence[dict[str, Any]]) -> list[Score]:
        return [self._score(t) for t in trajectories]

    def _score(self, trajectory: dict[str, Any]) -> Score:
        turn = parse_openai_message(trajectory['messages'][-1])
        answer = arith.evaluate(trajectory['user_data']['expression'])
        calls = [c for c in turn.tool_calls if c.name == 'calculator']
        called = len(calls) == len(turn.tool_calls) == 1 and not turn.errors
        if calls:
            correct = called and _value(calls[0].arguments.get('expression')) == answer
        else:
            correct = arith.extract_number(turn.content) == answer
        return Score(correct, float(correct), called)


def _value(expression: Any) -> Any:
    """The value of a call's expression, or None when it is not one the calculator evaluates."""
    if not isinstance(expression, str):
        return None
    try:
        return arith.evaluate(expression)
    except arith.ArithError:
        return None
