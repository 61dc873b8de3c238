"""Tool-call parsing of sampled assistant turns (Qwen3 / Hermes format) and the OpenAI message shape."""

from __future__ import annotations

import json

from twinkle_agentic.parsing import (
    ToolCall,
    format_tool_call,
    format_tool_response,
    from_openai_tool_calls,
    parse_openai_message,
    parse_turn,
    to_openai_tool_calls,
)

CALL = '<tool_call>\n{"name": "guess", "arguments": {"number": 50}}\n</tool_call>'


def test_plain_text_has_no_calls():
    turn = parse_turn('  The answer is 42.  ')
    assert turn.content == 'The answer is 42.' and turn.tool_calls == [] and turn.errors == []


def test_single_call_with_text_around():
    turn = parse_turn(f'Let me guess.\n{CALL}')
    assert turn.content == 'Let me guess.' and turn.errors == []
    assert turn.tool_calls == [ToolCall('guess', {'number': 50}, CALL)]


def test_multiple_calls_in_order():
    second = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 * 3"}}\n</tool_call>'
    turn = parse_turn(f'{CALL}\n{second}\nDone.')
    assert [c.name for c in turn.tool_calls] == ['guess', 'calculator']
    assert turn.tool_calls[1].arguments == {'expression': '2 * 3'} and turn.tool_calls[1].raw == second
    assert turn.content == 'Done.' and turn.errors == []


def test_compact_call_and_missing_or_string_arguments():
    turn = parse_turn(
        '<tool_call>{"name":"ping"}</tool_call><tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [('ping', {}), ('f', {'x': 1})]
    assert turn.errors == [] and turn.content == ''


def test_malformed_json_is_an_error_not_an_exception():
    turn = parse_turn('<tool_call>\n{"name": "guess", "arguments": {"number": 50}\n</tool_call> and text')
    assert turn.tool_calls == [] and turn.content == 'and text'
    assert len(turn.errors) == 1 and 'not valid JSON' in turn.errors[0]


def test_missing_name_and_non_dict_arguments():
    turn = parse_turn(
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "guess", "arguments": [50]}</tool_call>'
        '<tool_call>[1, 2]</tool_call>'
        '<tool_call>{"name": "", "arguments": {}}</tool_call>'
        f'{CALL}'
    )
    assert [c.name for c in turn.tool_calls] == ['guess']  # the good call is kept
    assert len(turn.errors) == 4
    assert 'no "name"' in turn.errors[0] and 'must be a JSON object, got list' in turn.errors[1]
    assert 'JSON object' in turn.errors[2] and 'no "name"' in turn.errors[3]


def test_unclosed_call():
    turn = parse_turn('Thinking... <tool_call>\n{"name": "guess", "argum')
    assert turn.tool_calls == [] and turn.content == 'Thinking...'
    assert len(turn.errors) == 1 and 'unclosed <tool_call>' in turn.errors[0]
    # an unclosed block followed by a closed one: one error, the closed call still parses
    turn = parse_turn(f'<tool_call>{{"name": "a"\n{CALL}')
    assert [c.name for c in turn.tool_calls] == ['guess'] and len(turn.errors) == 1
    assert 'unclosed' in turn.errors[0]


def test_stray_close_tag_stays_in_content():
    turn = parse_turn('oops </tool_call>')
    assert turn.content == 'oops </tool_call>' and turn.tool_calls == [] and turn.errors == []


def test_format_round_trip():
    call = ToolCall('calculator', {'expression': '12 × 3'})
    text = format_tool_call(call)
    assert text == '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 × 3"}}\n</tool_call>'
    parsed = parse_turn(text).tool_calls
    assert [(c.name, c.arguments) for c in parsed] == [('calculator', {'expression': '12 × 3'})]
    assert format_tool_response('42') == '<tool_response>\n42\n</tool_response>'


def test_openai_shape_and_inverse():
    calls = parse_turn(CALL + '\n<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>')
    shaped = to_openai_tool_calls(calls.tool_calls)
    assert shaped == [
        {'id': 'call_0', 'type': 'function', 'function': {'name': 'guess', 'arguments': '{"number": 50}'}},
        {'id': 'call_1', 'type': 'function', 'function': {'name': 'calculator', 'arguments': '{"expression": "1+1"}'}},
    ]
    assert [c['id'] for c in to_openai_tool_calls(calls.tool_calls, start=5)] == ['call_5', 'call_6']
    back = from_openai_tool_calls(shaped)
    assert [(c.name, c.arguments) for c in back.tool_calls] == [(c.name, c.arguments) for c in calls.tool_calls]
    assert back.errors == [] and back.content == ''
    # arguments as an object (as chat templates take them) and broken entries
    mixed = from_openai_tool_calls(
        [
            {'function': {'name': 'guess', 'arguments': {'number': 3}}},
            {'function': {'name': 'guess', 'arguments': '{not json'}},
            {'function': {'arguments': '{}'}},
            'nonsense',
        ]
    )
    assert [c.arguments for c in mixed.tool_calls] == [{'number': 3}] and len(mixed.errors) == 3
    assert json.loads(json.dumps(shaped))  # JSON-serialisable as sent


def test_parse_openai_message():
    message = {'role': 'assistant', 'content': None, 'tool_calls': to_openai_tool_calls(parse_turn(CALL).tool_calls)}
    turn = parse_openai_message(message)
    assert turn.content == '' and [c.arguments for c in turn.tool_calls] == [{'number': 50}]
    # an endpoint that did not parse the calls returns them as text
    turn = parse_openai_message({'role': 'assistant', 'content': f'Hmm. {CALL}'})
    assert turn.content == 'Hmm.' and [c.name for c in turn.tool_calls] == ['guess']
    turn = parse_openai_message({'role': 'assistant', 'content': [{'type': 'text', 'text': '7'}]})
    assert turn.content == '7' and turn.tool_calls == []
