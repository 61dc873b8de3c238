"""GuessNumberEnv and CalculatorTaskEnv played by scripted policies; both resolved by name from the registry."""

from __future__ import annotations

import pytest

from twinkle_agentic.envs import CalculatorTaskEnv, Env, GuessNumberEnv, StepResult, arith
from twinkle_agentic.parsing import parse_turn
from twinkle_core.env import Env as CoreEnv
from twinkle_core.registry import resolve


def _traj(**user_data):
    return {'messages': [{'role': 'user', 'content': 'Play.'}], 'user_data': user_data}


def _binary_search(env: GuessNumberEnv, use_tool: bool = True) -> tuple[list[StepResult], list[int]]:
    low, high, results, guesses = env.low, env.high, [], []
    while True:
        guess = (low + high) // 2
        guesses.append(guess)
        result = env.record(env.step('guess', {'number': guess}) if use_tool else env.respond(f'I guess {guess}.'))
        results.append(result)
        if result.done:
            return results, guesses
        if 'too low' in result.observation:
            low = guess + 1
        else:
            assert 'too high' in result.observation
            high = guess - 1


def test_reexports():
    assert Env is CoreEnv and issubclass(GuessNumberEnv, Env) and issubclass(CalculatorTaskEnv, Env)


@pytest.mark.parametrize('secret', [1, 37, 50, 99, 100])
def test_binary_search_wins_within_seven_guesses(secret):
    env = GuessNumberEnv()
    assert env.reset(_traj(secret=secret)) is None  # the prompt has a user turn: no intro
    results, guesses = _binary_search(env)
    assert len(guesses) <= 7 and guesses[-1] == secret
    assert results[-1].done and results[-1].reward == 1.0 and 'correct' in results[-1].observation
    assert all(r.reward == 0.0 and not r.done for r in results[:-1])
    assert env.evaluate({}) == 1.0


def test_plain_text_guesses_play_too():
    env = GuessNumberEnv(seed=3)
    rules = env.reset({'messages': [{'role': 'system', 'content': 'You play games.'}]})
    assert rules is not None and 'between 1 and 100' in rules and '7 guesses' in rules
    results, guesses = _binary_search(env, use_tool=False)
    assert guesses[-1] == env.secret and results[-1].reward == 1.0 and env.evaluate({}) == 1.0


def test_running_out_of_guesses_scores_zero():
    env = GuessNumberEnv(max_guesses=3, intro=True)
    assert env.reset(_traj(secret=80)) is not None
    first = env.step('guess', {'number': 10})
    assert first.observation == '10 is too low. 2 guesses left.' and not first.done
    assert env.step('guess', {'number': 90}).observation == '90 is too high. 1 guess left.'
    last = env.respond('maybe 20?')
    assert last.done and last.reward == 0.0 and 'the number was 80' in last.observation
    assert env.step('guess', {'number': 80}).done  # over: no more rewards
    assert env.evaluate({}) == 0.0


def test_invalid_actions_get_clear_observations_and_use_a_guess():
    env = GuessNumberEnv(max_guesses=6, invalid_penalty=0.1)
    env.reset(_traj(secret=42))
    cases = [
        (env.step('guess', {'number': 500}), 'out of range'),
        (env.step('guess', {'number': 'fifty'}), 'must be an integer'),
        (env.step('guess', {}), 'needs an integer argument'),
        (env.step('calculator', {'expression': '1+1'}), 'Unknown tool'),
        (env.respond('no idea'), 'No number found'),
    ]
    for result, text in cases:
        assert text in result.observation and result.reward == -0.1 and not result.done
    assert env.step('guess', {'number': '42'}).reward == 1.0  # a numeric string is read
    assert env.guesses == [None] * 5 + [42]


def test_secret_from_seed_and_from_user_data():
    a, b = GuessNumberEnv(seed=7), GuessNumberEnv(seed=7)
    a.reset(_traj())
    b.reset(_traj())
    assert a.secret == b.secret and 1 <= a.secret <= 100
    env = GuessNumberEnv()
    env.reset(_traj(secret=5, low=0, high=9, max_guesses=4))
    assert (env.secret, env.low, env.high, env.max_guesses) == (5, 0, 9, 4)
    with pytest.raises(ValueError, match='secret'):
        GuessNumberEnv().reset(_traj(secret=1000))


def test_guess_tool_schema_and_call():
    env = GuessNumberEnv()
    env.reset(_traj(secret=10))
    (tool,) = env.tools()
    assert tool.name == 'guess' and tool.sandboxed is False
    assert tool.schema()['function']['parameters']['properties']['number'] == {
        'type': 'integer',
        'description': 'your guess',
    }
    assert tool(number=10) == '10 is correct!'


def test_calculator_env_rewards_the_right_number_and_counts_tool_calls():
    env = CalculatorTaskEnv()
    assert env.reset(_traj(expression='1234 * 5678')) is None
    (tool,) = env.tools()
    assert tool.name == 'calculator' and tool.sandboxed is False
    # the policy writes a call; the rollout routes it to step
    call = parse_turn('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1234 * 5678"}}\n</tool_call>')
    result = env.record(env.step(call.tool_calls[0].name, call.tool_calls[0].arguments))
    assert result.observation == '7006652' and result.reward == 0.0 and not result.done
    assert result.info['tool_calls'] == 1
    bad = env.record(env.step('calculator', {'expression': '__import__("os").system("true")'}))
    assert bad.observation.startswith('Error: unsupported syntax') and bad.info['tool_calls'] == 2
    final = env.record(env.respond('So the answer is 7,006,652.'))
    assert (
        final.done
        and final.reward == 1.0
        and final.info
        == {
            'tool_calls': 2,
            'correct': True,
            'expected': '7006652',
            'answer': '7006652',
        }
    )
    assert env.evaluate({}) == 1.0


@pytest.mark.parametrize('reply', ['7006653', 'I do not know.', '\\boxed{7006650} (not 7006652)'])
def test_calculator_env_wrong_answers_get_zero(reply):
    env = CalculatorTaskEnv()
    env.reset(_traj(expression='1234 * 5678'))
    result = env.record(env.respond(reply))
    assert result.done and result.reward == 0.0 and result.info['correct'] is False
    assert result.info['tool_calls'] == 0 and env.evaluate({}) == 0.0


def test_calculator_env_generates_tasks_and_limits_calls():
    env = CalculatorTaskEnv(seed=0, max_tool_calls=2)
    task = env.reset({'messages': []})
    assert task is not None and task.startswith(f'Compute {env.expression}.')
    assert '*' in env.expression and env.answer == arith.evaluate(env.expression)
    assert CalculatorTaskEnv(seed=0).reset({'messages': []}) == task  # seeded: reproducible
    assert env.step('calculator', {'expression': '1/0'}).observation == 'Error: division by zero'
    assert 'the only tool' in env.step('guess', {}).observation
    over = env.step('calculator', {'expression': '1+1'})
    assert over.done and over.reward == 0.0 and over.info['tool_calls'] == 3
    assert env.respond(arith.format_number(env.answer)).reward == 0.0  # the episode is over


def test_arith_is_safe_and_exact():
    assert arith.format_number(arith.evaluate('(1 + 2) * 3 ^ 2 - 7 / 2')) == '23.5'
    assert arith.evaluate('2 ** 100') == 2**100
    for bad in ['x + 1', '9 ** 9 ** 9', 'abs(-1)', '[1][0]', '1 if 1 else 2', '', '1' * 600]:
        with pytest.raises(arith.ArithError):
            arith.evaluate(bad)
    assert arith.extract_number('x = -12.5, then 3') == 3 and arith.extract_number('none') is None


def test_envs_resolve_by_name():
    env = resolve('env', 'GuessNumberEnv', low=1, high=10, max_guesses=4, seed=1)
    assert isinstance(env, GuessNumberEnv) and (env.high, env.max_guesses) == (10, 4)
    calc = resolve('env', 'CalculatorTaskEnv', seed=2)
    assert isinstance(calc, CalculatorTaskEnv)
    calc.reset(_traj(expression='2 * 21'))
    assert calc.respond('42').reward == 1.0
