"""Tool rendering of the OpenAI-compatible endpoint, in process (no server): the fallback (hermes) tool text written
for a template without tool support (`PLAIN_CHATML`), a template that renders tools itself (`QWEN_STYLE`), the
training-side `Template` rendering the same prompts, and the hermes parser."""

from __future__ import annotations

import copy
import json

from openai_tools import CALL_TEXT, QUESTION, TOOLS, request

from twinkle_core.template.tool_calls import FORMATS, HermesFormat, ParsedCall, format_for
from twinkle_server.api.openai.chat import ChatRenderer

RESULT = '{"temperature_c": 21}'
PLAIN_CHATML = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN_STYLE = (
    '{%- if tools %}{{- "<|im_start|>system\\n" }}'
    '{%- if messages[0].role == "system" %}{{- messages[0].content + "\\n\\n" }}{%- endif %}'
    '{{- "# Tools\\n\\n<tools>" }}{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "\\n</tools>\\n\\nFor each function call, return <tool_call></tool_call> XML tags<|im_end|>\\n" }}'
    '{%- elif messages[0].role == "system" %}{{- "<|im_start|>system\\n" + messages[0].content + "<|im_end|>\\n" }}'
    '{%- endif %}'
    '{%- for message in messages %}'
    '{%- if message.role == "user" or (message.role == "system" and not loop.first) %}'
    '{{- "<|im_start|>" + message.role + "\\n" + message.content + "<|im_end|>\\n" }}'
    '{%- elif message.role == "assistant" %}{{- "<|im_start|>assistant" }}'
    '{%- if message.content %}{{- "\\n" + message.content }}{%- endif %}'
    '{%- for tool_call in message.tool_calls or [] %}'
    '{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}'
    '{{- "\\n<tool_call>\\n{\\"name\\": \\"" + tool_call.name + "\\", \\"arguments\\": " }}'
    '{{- tool_call.arguments | tojson }}{{- "}\\n</tool_call>" }}{%- endfor %}{{- "<|im_end|>\\n" }}'
    '{%- elif message.role == "tool" %}'
    '{%- if loop.first or messages[loop.index0 - 1].role != "tool" %}{{- "<|im_start|>user" }}{%- endif %}'
    '{{- "\\n<tool_response>\\n" + message.content + "\\n</tool_response>" }}'
    '{%- if loop.last or messages[loop.index0 + 1].role != "tool" %}{{- "<|im_end|>\\n" }}{%- endif %}'
    '{%- endif %}{%- endfor %}'
    '{%- if add_generation_prompt %}{{- "<|im_start|>assistant\\n" }}{%- endif %}'
)


def test_fallback_rendering_on_a_template_without_tools(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = PLAIN_CHATML
    renderer = ChatRenderer(tok)
    assert not renderer.native_tools and renderer.tool_format.name == 'hermes'
    system = [{'role': 'system', 'content': 'Be brief.'}]
    text = renderer.render(request(messages=system + QUESTION, tools=TOOLS)).text
    assert text.startswith('<|im_start|>system\nBe brief.\n\n# Tools\n')
    assert f'<tools>\n{json.dumps(TOOLS[0])}\n</tools>' in text and text.endswith('<|im_start|>assistant\n')
    assert '# Tools' not in renderer.render(request(messages=QUESTION, tools=TOOLS, tool_choice='none')).text
    forced = renderer.render(
        request(messages=QUESTION, tools=TOOLS, tool_choice={'type': 'function', 'function': {'name': 'get_weather'}})
    )
    assert forced.prefill == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert forced.text.endswith('<|im_start|>assistant\n' + forced.prefill)
    assert renderer.render(request(messages=QUESTION, tools=TOOLS, tool_choice='required')).prefill.endswith(
        '{"name": "'
    )


def test_the_training_template_renders_tools_as_the_server_prompts(tokenizer):
    """A template without tool support: `Template` (training) renders tools, calls and results as the plain turns
    the server prompts with, so an adapter trained on them is served the same tokens; only the assistant's call
    and answer are trained. The same conversation on a template that renders tools is passed through natively."""
    from twinkle_core.registry import resolve

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = PLAIN_CHATML
    renderer, template = ChatRenderer(tok), resolve('template', 'Template', model_id_or_tokenizer=tok)
    assert not template.renders_tools and template.tool_format is renderer.tool_format
    call = {'id': 'call_1', 'type': 'function', 'function': {'name': 'get_weather', 'arguments': '{"city":"Paris"}'}}
    system = [{'role': 'system', 'content': 'Be brief.'}]
    turns = system + QUESTION + [{'role': 'assistant', 'content': '', 'tool_calls': [call]}]
    turns += [{'role': 'tool', 'tool_call_id': 'call_1', 'content': RESULT}, {'role': 'tool', 'content': 'more'}]
    answer = {'role': 'assistant', 'content': 'It is 21 C.'}

    def served(messages, renderer=renderer) -> list[int]:
        text = renderer.render(request(messages=messages, tools=TOOLS)).text
        return tok(text, add_special_tokens=False)['input_ids']

    for prompt in (system + QUESTION, turns):
        assert template.encode({'messages': prompt, 'tools': TOOLS}, add_generation_prompt=True)['input_ids'] == (
            served(prompt)
        )
    row = template.encode({'messages': turns + [answer], 'tools': TOOLS})
    first_call = served(system + QUESTION)
    assert row['input_ids'][: len(first_call)] == first_call  # each turn's prompt is a prefix of the episode
    trained = tok.decode([t for t in row['labels'] if t != -100])
    call_text = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'
    assert (
        trained == f'{call_text}<|im_end|>It is 21 C.<|im_end|>'
    )  # the arguments as the model wrote them; the tools, the system turn and the results are not trained
    assert '<tool_response>\n21' not in trained and template.tool_format.parse(trained.split('<|im_end|>')[0]).calls

    tok.chat_template = QWEN_STYLE  # a template that renders tools gets them as transformers passes them
    native = resolve('template', 'Template', model_id_or_tokenizer=tok)
    assert native.renders_tools and ChatRenderer(tok).native_tools
    prompt = native.encode({'messages': turns, 'tools': TOOLS}, add_generation_prompt=True)['input_ids']
    assert prompt == served(turns, ChatRenderer(tok)) and '<tools>' in tok.decode(prompt)


def test_a_template_that_renders_tools_gets_them_natively(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN_STYLE
    renderer = ChatRenderer(tok)
    assert renderer.native_tools and renderer.tool_format is FORMATS['hermes']
    messages = QUESTION + [
        {'role': 'assistant', 'content': None, 'tool_calls': [
            {'id': 'call_1', 'type': 'function',
             'function': {'name': 'get_weather', 'arguments': '{"city": "Paris"}'}}
        ]},
        {'role': 'tool', 'tool_call_id': 'call_1', 'content': RESULT},
    ]  # fmt: skip
    text = renderer.render(request(messages=messages, tools=TOOLS)).text
    assert text.startswith('<|im_start|>system\n# Tools\n\n<tools>\n{"type": "function"')
    assert '"name": "get_weather"' in text and '"required": ["city"]' in text
    assert f'<|im_start|>assistant\n{CALL_TEXT}<|im_end|>' in text
    assert f'<|im_start|>user\n<tool_response>\n{RESULT}\n</tool_response><|im_end|>' in text
    # what such a model writes back parses into the call
    parsed = renderer.tool_format.parse(CALL_TEXT)
    assert parsed.content is None and parsed.calls == [ParsedCall('get_weather', '{"city": "Paris"}')]


def test_hermes_parser():
    fmt = HermesFormat()
    assert format_for('... <tool_call> ...').name == 'hermes' and format_for(None).name == 'hermes'
    two = fmt.render_calls('Let me check.', [ParsedCall('a', '{"x": 1}'), ParsedCall('b', '{}')])
    assert fmt.parse(two).content == 'Let me check.'
    assert fmt.parse(two).calls == [ParsedCall('a', '{"x": 1}'), ParsedCall('b', '{}')]
    unclosed = '<tool_call>\n{"name": "a", "arguments": {"y": "ü"}}'
    assert fmt.parse(unclosed).calls == [ParsedCall('a', '{"y": "ü"}')]
    assert fmt.parse('<tool_call>{"name": "a", "arguments": "{\\"z\\": 2}"}</tool_call>').calls == [
        ParsedCall('a', '{"z": 2}')
    ]
    for broken in ('no call here', '<tool_call>{"name": "a", "arguments": {</tool_call>', '<tool_call>[1]</tool_call>'):
        assert fmt.parse(broken) is None
