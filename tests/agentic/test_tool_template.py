"""The tiny fixture's chat template renders tools, tool calls and tool results Qwen3-style, and renders every
conversation without them byte-for-byte as the plain ChatML template before it did."""

from __future__ import annotations

import copy
import json

import pytest

from twinkle_agentic.envs import GuessNumberEnv
from twinkle_agentic.parsing import parse_turn, to_openai_tool_calls
from twinkle_core.fixtures.tiny_model import CHAT_TEMPLATE

# The fixture's template before tool support (copied verbatim): the reference for tool-free conversations.
OLD_CHAT_TEMPLATE = (
    '{%- for message in messages %}'
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    '{%- else %}'
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    '{%- endif %}'
    '{%- endfor %}'
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CONVERSATIONS = [
    [{'role': 'user', 'content': 'hi'}],
    [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello!'}],
    [
        {'role': 'system', 'content': 'You are a helpful assistant.'},
        {'role': 'user', 'content': 'What is 2+2?'},
        {'role': 'assistant', 'content': '4'},
        {'role': 'user', 'content': 'And 3+3?'},
        {'role': 'assistant', 'content': '<think>\nadd\n</think>\n\n6', 'loss': False},
    ],
    [{'role': 'system', 'content': ''}, {'role': 'user', 'content': 'ünïcödé {{ braces }} </tool_call>'}],
    [{'role': 'user', 'content': 'x'}, {'role': 'assistant', 'content': ''}, {'role': 'user', 'content': 'y'}],
    [{'role': 'user', 'content': 'a'}, {'role': 'assistant', 'content': 'b', 'tool_calls': None}],
]

TOOLS = [GuessNumberEnv().tools()[0].schema()]
ROUND_TRIP = [
    {'role': 'system', 'content': 'Play well.'},
    {'role': 'user', 'content': 'Guess my number.'},
    {
        'role': 'assistant',
        'content': 'Let me start in the middle.',
        'tool_calls': [{'type': 'function', 'function': {'name': 'guess', 'arguments': {'number': 50}}}],
    },
    {'role': 'tool', 'content': '50 is too low. 6 guesses left.'},
    {
        'role': 'assistant',
        'content': '',
        'tool_calls': [
            {'id': 'call_0', 'type': 'function', 'function': {'name': 'guess', 'arguments': '{"number": 75}'}},
            {'name': 'guess', 'arguments': {'number': 76}},  # a bare call (no "function" wrapper)
        ],
    },
    {'role': 'tool', 'content': '75 is too high.'},
    {'role': 'tool', 'content': '76 is too high.'},
]

EXPECTED = (
    '<|im_start|>system\nPlay well.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.'
    '\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n'
    + json.dumps(TOOLS[0], ensure_ascii=False)
    + '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    '</tool_call><|im_end|>\n'
    '<|im_start|>user\nGuess my number.<|im_end|>\n'
    '<|im_start|>assistant\nLet me start in the middle.\n'
    '<tool_call>\n{"name": "guess", "arguments": {"number": 50}}\n</tool_call><|im_end|>\n'
    '<|im_start|>user\n<tool_response>\n50 is too low. 6 guesses left.\n</tool_response><|im_end|>\n'
    '<|im_start|>assistant\n<tool_call>\n{"name": "guess", "arguments": {"number": 75}}\n</tool_call>\n'
    '<tool_call>\n{"name": "guess", "arguments": {"number": 76}}\n</tool_call><|im_end|>\n'
    '<|im_start|>user\n<tool_response>\n75 is too high.\n</tool_response>\n'
    '<tool_response>\n76 is too high.\n</tool_response><|im_end|>\n'
    '<|im_start|>assistant\n'
)


@pytest.fixture(scope='module')
def tokenizers(tiny_model_dir):
    from transformers import AutoTokenizer

    new = AutoTokenizer.from_pretrained(tiny_model_dir)
    old = copy.deepcopy(new)
    old.chat_template = OLD_CHAT_TEMPLATE
    return old, new


def test_fixture_carries_the_template(tokenizers):
    assert tokenizers[1].chat_template == CHAT_TEMPLATE


@pytest.mark.parametrize('messages', CONVERSATIONS)
@pytest.mark.parametrize('add_generation_prompt', [False, True])
def test_tool_free_conversations_render_byte_identically(tokenizers, messages, add_generation_prompt):
    old, new = tokenizers
    kwargs = {'tokenize': False, 'add_generation_prompt': add_generation_prompt}
    assert new.apply_chat_template(messages, **kwargs) == old.apply_chat_template(messages, **kwargs)
    for tools in (None, []):  # no tools is the same as an empty list
        assert new.apply_chat_template(messages, tools=tools, **kwargs) == old.apply_chat_template(messages, **kwargs)
    if messages[-1]['role'] == 'assistant':  # the generation (assistant) mask is unchanged too
        mask = {'tokenize': True, 'return_dict': True, 'return_assistant_tokens_mask': True}
        a, b = old.apply_chat_template(messages, **mask), new.apply_chat_template(messages, **mask)
        assert list(a['input_ids']) == list(b['input_ids']) and list(a['assistant_masks']) == list(b['assistant_masks'])


def test_tool_round_trip_renders_qwen3_style(tokenizers):
    new = tokenizers[1]
    text = new.apply_chat_template(ROUND_TRIP, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text == EXPECTED
    # without a system message the tools block opens the conversation on its own
    text = new.apply_chat_template(ROUND_TRIP[1:4], tools=TOOLS, tokenize=False)
    assert text.startswith('<|im_start|>system\n# Tools\n\n') and text.count('<|im_start|>system') == 1
    assert text.endswith('</tool_response><|im_end|>\n')


def test_a_sampled_call_renders_back_as_sampled(tokenizers):
    """What the model writes, parsed and put back as an assistant message, renders to the same text."""
    new = tokenizers[1]
    sampled = 'Try 50.\n<tool_call>\n{"name": "guess", "arguments": {"number": 50}}\n</tool_call>'
    turn = parse_turn(sampled)
    message = {'role': 'assistant', 'content': turn.content, 'tool_calls': to_openai_tool_calls(turn.tool_calls)}
    prompt = [{'role': 'user', 'content': 'Guess.'}]
    before = new.apply_chat_template(prompt, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    after = new.apply_chat_template(prompt + [message], tools=TOOLS, tokenize=False)
    assert after == before + sampled + '<|im_end|>\n'


def test_assistant_mask_covers_calls(tokenizers):
    new = tokenizers[1]
    out = new.apply_chat_template(
        ROUND_TRIP, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = list(out['input_ids']), list(out['assistant_masks'])
    runs = new.decode([t for t, m in zip(ids, mask) if m])
    assert runs.count('<|im_end|>') == 2 and runs.count('<tool_call>') == 3
    assert '<tool_response>' not in runs and 'Guess my number' not in runs


def test_markers_tokenize_into_a_few_tokens(tokenizers):
    new = tokenizers[1]
    for marker in ('<tool_call>', '</tool_call>', '<tool_response>', '</tool_response>'):
        ids = new(marker, add_special_tokens=False)['input_ids']
        assert new.decode(ids) == marker and len(ids) <= len(marker)


class ScriptedSampler:
    """Returns the next of `turns` (texts, tokenized, ended by end-of-turn) for every prompt: the model's output is
    the test's input here; the rollout around it is real."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns = tokenizer, list(turns)

    def sample(self, prompts, params, **kwargs):
        from twinkle_core.types import SampledSequence, SampleResponse

        ids = self.tokenizer(self.turns.pop(0), add_special_tokens=False)['input_ids'] + [self.tokenizer.eos_token_id]
        seq = SampledSequence(tokens=ids, logprobs=[-1.0] * len(ids), stop_reason='stop')
        return [SampleResponse(sequences=[seq]) for _ in prompts]


def test_a_template_without_tool_support_gets_tools_in_the_hermes_format(tokenizers):
    """On a plain template (the fixture's old one: no tools), a multi-turn rollout prompts with the tools described
    in the system turn and returns results in a user turn of `<tool_response>` blocks, and its token-exact episode is
    what `Template` encodes for the same conversation (the rendering the server's /v1 uses too)."""
    from twinkle_agentic.rollout import MultiTurnRollout
    from twinkle_core.template.chat_template import ChatTemplate

    old = tokenizers[0]
    template = ChatTemplate(old)
    assert not template.renders_tools and template.tool_format.name == 'hermes'
    call = '<tool_call>\n{"name": "guess", "arguments": {"number": 50}}\n</tool_call>'
    rollout = MultiTurnRollout(
        ScriptedSampler(old, [call, 'Done.']), template, env=GuessNumberEnv, max_turns=2, sampling_params={}
    )
    (episode,) = rollout([{'messages': [{'role': 'user', 'content': 'Guess my number.'}], 'user_data': {'secret': 7}}])
    text = old.decode(episode['input_ids'])
    assert text.startswith('<|im_start|>system\n# Tools\n') and json.dumps(TOOLS[0]) in text
    assert f'<|im_start|>assistant\n{call}<|im_end|>\n<|im_start|>user\n<tool_response>\n' in text
    encoded = template.encode({'messages': episode['messages'], 'tools': TOOLS})
    n = len(encoded['input_ids'])  # the episode ends at the next generation prompt (after the env's last answer)
    assert episode['input_ids'][:n] == encoded['input_ids'] and text.endswith('<|im_start|>assistant\n')
    assert old.decode(episode['input_ids'][n:]) == '<|im_start|>assistant\n'
    assert [t for t in encoded['labels'] if t != -100] == [t for t in episode['labels'] if t != -100]
