"""Tools: ``@tool`` schemas and argument checks, the calculator, and `ToolManager` -- tools by registry name (a
built-in one, and a third-party one through an entry point of a distribution written here), by instance and by
function; errors come back as text the model can read. Sandbox limits are tests/agentic/test_sandbox.py."""

from __future__ import annotations

import time
from typing import Literal

import pytest

from twinkle_agentic.tools import Calculator, PythonTool, Tool, ToolError, ToolManager, tool
from twinkle_core.registry import resolve


@tool
def search(
    query: str,
    top_k: int = 3,
    mode: Literal['web', 'news'] = 'web',
    tags: list[str] | None = None,
    weight: float = 1.0,
    exact: bool = False,
) -> str:
    """Search a corpus.

    Returns the best passages.

    Args:
        query: What to look for; a few
            keywords work best.
        top_k (int): How many passages.
        mode: Index.

    Returns:
        The passages, one a line.
    """
    return f'{query}|{top_k}|{mode}|{tags}|{weight}|{exact}'


@tool(name='shout', timeout_s=5.0)
def shout_tool(text: str) -> str:
    """Upper-cases `text` (the third-party tool below reaches a worker process by this module's import path).

    Args:
        text: What to shout.
    """
    return text.upper() + '!'


def test_decorator_schema_from_hints_and_docstring() -> None:
    assert isinstance(search, Tool) and search.name == 'search' and search.sandboxed and search.timeout_s == 10.0
    assert search.schema() == {
        'type': 'function',
        'function': {
            'name': 'search',
            'description': 'Search a corpus. Returns the best passages.',
            'parameters': {
                'type': 'object',
                'properties': {
                    'query': {'type': 'string', 'description': 'What to look for; a few keywords work best.'},
                    'top_k': {'type': 'integer', 'description': 'How many passages.', 'default': 3},
                    'mode': {'type': 'string', 'enum': ['web', 'news'], 'description': 'Index.', 'default': 'web'},
                    'tags': {'type': ['array', 'null'], 'items': {'type': 'string'}, 'default': None},
                    'weight': {'type': 'number', 'default': 1.0},
                    'exact': {'type': 'boolean', 'default': False},
                },
                'required': ['query'],
            },
        },
    }
    assert shout_tool.name == 'shout' and shout_tool.timeout_s == 5.0 and shout_tool.fn.__name__ == 'shout_tool'
    assert search(query='q', top_k=2.0, weight=2) == 'q|2|web|None|2.0|False'  # 2.0 -> 2, 2 -> 2.0


def test_decorator_refuses_signatures_json_cannot_carry() -> None:
    def dated(when: time.struct_time) -> str:
        return ''

    assert tool(lambda when: when).parameters['properties'] == {'when': {}}  # untyped: any JSON value
    with pytest.raises(TypeError, match="tool 'dated', parameter 'when'.* has no JSON schema"):
        tool(dated)
    with pytest.raises(TypeError, match='plain keyword'):
        tool(lambda *args: args)


@pytest.mark.parametrize(
    ('arguments', 'message'),
    [
        ({}, "missing required argument 'query'"),
        ({'query': 3}, "argument 'query' must be a string, got integer 3"),
        ({'query': 'q', 'limit': 1}, "unknown argument 'limit' (expected: query, top_k, mode, tags, weight, exact)"),
        ({'query': 'q', 'top_k': '3'}, "argument 'top_k' must be an integer, got string '3'"),
        ({'query': 'q', 'top_k': 2.5}, "argument 'top_k' must be an integer, got number 2.5"),
        ({'query': 'q', 'exact': 1}, "argument 'exact' must be a boolean, got integer 1"),
        ({'query': 'q', 'mode': 'blog'}, "argument 'mode' must be one of ['web', 'news'], got 'blog'"),
        ({'query': 'q', 'tags': ['a', 2]}, "argument 'tags[1]' must be a string, got integer 2"),
    ],
)
def test_arguments_are_checked_against_the_schema(arguments: dict, message: str) -> None:
    with pytest.raises(ToolError) as info:
        search(**arguments)
    assert str(info.value) == f"bad arguments for tool 'search': {message}"


@pytest.mark.parametrize(
    ('expression', 'value'),
    [
        ('1 + 2 * 3', '7'),
        ('(3 + 4) * 2 ** 3', '56'),
        ('7 / 2', '3.5'),
        ('7 // 2', '3'),
        ('-7 % 3', '2'),
        ('2 ** -1', '0.5'),
        ('0.1 + 0.2', '0.3'),
        ('sqrt(16) + abs(-2)', '6'),
        ('round(2.567, 2)', '2.57'),
        ('max(1, 5, 3) - min(4, 2)', '3'),
        ('2 ** 100', str(2**100)),
        ('round(pi, 4)', '3.1416'),
    ],
)
def test_calculator_values(expression: str, value: str) -> None:
    assert Calculator()(expression=expression) == value


@pytest.mark.parametrize(
    ('expression', 'message'),
    [
        ('9**9**9', 'too large'),
        ('2 ** 100000', 'too large'),
        ('10**1000 * 10**1000', 'too large'),
        ('2.0 ** 5000', 'too large'),
        ('1 / 0', 'division by zero'),
        ('__import__("os").system("true")', 'not allowed'),
        ('x + 1', 'not allowed'),
        ('"a" * 3', 'not allowed'),
        ('(1).__class__', 'not allowed'),
        ('True + 1', 'not allowed'),
        ('[1] * 10', 'not allowed'),
        ('lambda: 1', 'not allowed'),
        ('sqrt(-1)', 'math domain error'),
        ('1 +', 'not an arithmetic expression'),
        ('1+' * 600 + '1', 'too long'),
    ],
)
def test_calculator_refusals(expression: str, message: str) -> None:
    start = time.monotonic()
    with pytest.raises(ToolError, match=message):
        Calculator()(expression=expression)
    assert time.monotonic() - start < 0.5


def test_manager_by_registry_name_and_instance() -> None:
    assert isinstance(resolve('tool', 'calculator'), Calculator)
    assert isinstance(resolve('tool', 'python'), PythonTool)
    with ToolManager(['calculator', PythonTool(timeout_s=5), search]) as tm:
        assert tm.names() == ['calculator', 'python', 'search']
        assert [s['function']['name'] for s in tm.schemas()] == tm.names()
        assert tm.get('python').timeout_s == 5.0
        result = tm.call('calculator', {'expression': '6 * 7'})
        assert (result.name, result.output, result.ok, result.error) == ('calculator', '42', True, None)
        assert tm.call('calculator', '{"expression": "2 ** 10"}').output == '1024'
        assert tm.call('search', {'query': 'x'}).output == 'x|3|web|None|1.0|False'  # in a worker process
        with pytest.raises(KeyError, match="unknown tool 'foo'; available: calculator, python, search"):
            tm.get('foo')

    def double(x: int) -> int:
        """Twice `x`.

        Args:
            x: A number.
        """
        return 2 * x

    with ToolManager([double]) as tm:  # a plain typed function, made a tool (sandboxed, sent by value)
        assert tm.schemas()[0]['function']['parameters']['properties'] == {
            'x': {'type': 'integer', 'description': 'A number.'}
        }
        assert tm.call('double', {'x': 21}).output == '42'
    with pytest.raises(Exception, match="two tools are named 'calculator'"):
        ToolManager(['calculator', Calculator()])


def test_errors_become_text_the_model_reads() -> None:
    with ToolManager(['calculator', 'python']) as tm:
        unknown = tm.call('foo', {})
        assert (unknown.ok, unknown.error) == (False, 'unknown_tool')
        assert unknown.output == "Error: unknown tool 'foo'; available: calculator, python"
        bad_json = tm.call('calculator', '{"expression": ')
        assert bad_json.error == 'bad_arguments'
        assert bad_json.output.startswith("Error: bad arguments for tool 'calculator': not valid JSON")
        wrong = tm.call('calculator', {'expr': '1'})
        assert wrong.error == 'bad_arguments' and "unknown argument 'expr'" in wrong.output
        refused = tm.call('calculator', {'expression': '9**9**9'})
        assert refused.error == 'bad_arguments' and refused.output.startswith('Error: the result is too large')
        # the Twinkle-style call: a dict in either shape, answered with text, never raising
        assert tm({'name': 'calculator', 'arguments': {'expression': '1+1'}}) == '2'
        openai_call = {'type': 'function', 'function': {'name': 'calculator', 'arguments': '{"expression": "3*3"}'}}
        assert tm(openai_call) == '9'
        assert tm({'name': 'nope', 'arguments': '{}'}) == "Error: unknown tool 'nope'; available: calculator, python"
        assert tm({'arguments': {}}).startswith('Error: a tool call needs a tool name')
        assert tm({'name': 'calculator', 'arguments': 'not json'}).startswith('Error: bad arguments')
        assert tm(None).startswith('Error: malformed tool call')  # type: ignore[arg-type]


def test_unsandboxed_tool_runs_here_with_a_thread_timeout() -> None:
    @tool(sandboxed=False, timeout_s=0.3)
    def nap(seconds: float) -> str:
        """Sleep."""
        time.sleep(seconds)
        return 'rested'

    @tool(sandboxed=False)
    def broken() -> str:
        """Fails."""
        raise ValueError('no luck')

    with ToolManager([nap, broken]) as tm:
        assert tm.call('nap', {'seconds': 0}).output == 'rested'
        slow = tm.call('nap', {'seconds': 3})
        assert (slow.error, slow.output) == ('timeout', "Error: tool 'nap' timed out after 0.3 s")
        assert slow.elapsed_s < 2
        assert tm.call('broken', {}).output == "Error: tool 'broken' failed: ValueError: no luck"


def test_third_party_tool_by_entry_point(third_party_dist) -> None:
    third_party_dist('twinkle-tp-tools', 'twinkle.tool', f'shout = {__name__}:shout_tool')
    from twinkle_core.registry import list_components

    info = next(c for c in list_components('tool') if c.name == 'shout')
    assert (info.provider, info.source) == ('twinkle-tp-tools', 'entry_point')
    assert resolve('tool', 'shout') is shout_tool
    with ToolManager(['shout', 'calculator']) as tm:
        assert tm.names() == ['shout', 'calculator']
        result = tm.call('shout', {'text': 'hello'})  # sandboxed: the worker imports this module by name
        assert (result.ok, result.output) == (True, 'HELLO!'), result
